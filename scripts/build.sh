#!/usr/bin/env bash
# Builds static binaries into bin/ with one `go build` (make build, make run),
# and shows progress while it compiles: the module downloads as Go reports
# them, then a count of the packages compiled.
# Usage: build.sh LDFLAGS NAME:PKG...
set -euo pipefail
cd "$(dirname "$0")/.."

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

mkdir -p bin
out=$(mktemp -d bin/.build-XXXXXX)
trap 'rm -rf "$out"' EXIT
export CGO_ENABLED=0

echo "building ${names[*]}"
# The packages this build compiles at most (fewer when the build cache has
# some); listing them also downloads the modules, which Go reports.
total=$(go list -deps "${pkgs[@]}" | wc -l)
tty=0
[ -t 1 ] && tty=1
# go build -v names each package as it compiles it; anything else it prints
# (errors) is shown as it comes.
status=0
go build -v -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 | {
  n=0
  while IFS= read -r line; do
    case $line in
      *' '* | '#'* | '')
        ((tty)) && printf '\n'
        printf '%s\n' "$line"
        ;;
      *)
        n=$((n + 1))
        if ((tty)); then
          printf '\r  compiled %d of at most %d packages' "$n" "$total"
        elif ((n % 100 == 0)); then
          printf '  compiled %d of at most %d packages\n' "$n" "$total"
        fi
        ;;
    esac
  done
  if ((tty)); then
    ((n > 0)) && printf '\r  compiled %d of at most %d packages\n' "$n" "$total"
  else
    printf '  compiled %d packages (the rest were in the build cache)\n' "$n"
  fi
} || status=$?
[ "$status" = 0 ] || exit "$status"

for i in "${!pkgs[@]}"; do
  mv -f "$out/$(basename "${pkgs[$i]}")" "bin/${names[$i]}"
  echo "built bin/${names[$i]}"
done
