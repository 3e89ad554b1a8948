#!/usr/bin/env bash
# Builds a pinned tool from its module under tools/ (make tools, make
# grpcurl, make jaeger), with the progress build.sh shows, on stderr: stdout
# stays free for `make -s grpcurl`, which prints the tool's path.
# Usage: tool-build.sh MODULE_DIR OUT PACKAGE [go build flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/progress.sh
. scripts/progress.sh

dir=$1 out=$2 pkg=$3
shift 3
mkdir -p "$(dirname "$out")"
echo "building $(basename "$out") from $dir (a few minutes the first time)" >&2
# The packages this build compiles at most; listing them also downloads the
# modules, which Go reports.
total=$(go -C "$dir" list -deps "$pkg" | wc -l)
status=0
go -C "$dir" build -v "$@" -o "$out.partial" "$pkg" 2>&1 | progress "$total" >&2 || status=$?
if [ "$status" != 0 ]; then
  rm -f "$out.partial"
  exit "$status"
fi
mv -f "$out.partial" "$out"
echo "built $out" >&2
