#!/usr/bin/env bash
# Builds static binaries into bin/ with one `go build` (make build, make run),
# and shows progress while it compiles: the module downloads as Go reports
# them, then a count of the packages compiled, at least every 10 seconds.
# Usage: build.sh LDFLAGS NAME:PKG...
# NODEPLUG_BIN_DIR puts the binaries elsewhere than bin/ (figures-build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/progress.sh
. scripts/progress.sh

ldflags=$1
shift
names=() pkgs=()
for b in "$@"; do
  name=${b%%:*} pkg=${b#*:}
  [ -d "$pkg" ] || continue
  names+=("$name")
  pkgs+=("$pkg")
done
[ ${#pkgs[@]} -gt 0 ] || exit 0

bin=${NODEPLUG_BIN_DIR:-bin}
mkdir -p "$bin"
out=$(mktemp -d "$bin/.build-XXXXXX")
trap 'rm -rf "$out"' EXIT
export CGO_ENABLED=0

echo "building ${names[*]}"
# The packages this build compiles at most (fewer when the build cache has
# some); listing them also downloads the modules, which Go reports.
total=$(go list -deps "${pkgs[@]}" | wc -l)
# go build -v names each package as it compiles it; anything else it prints
# (errors) is shown as it comes.
status=0
go build -v -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 | {
  progress "$total"
} || status=$?
[ "$status" = 0 ] || exit "$status"

for i in "${!pkgs[@]}"; do
  mv -f "$out/$(basename "${pkgs[$i]}")" "$bin/${names[$i]}"
  echo "built $bin/${names[$i]}"
done
