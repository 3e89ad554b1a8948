#!/usr/bin/env bash
# Measures what a newcomer's first `make run` costs before the stack is up:
# the build of what make run starts, with an empty module cache and an
# empty build cache (each in a temporary directory, so yours stay as they
# are). Writes the figures as Markdown, with the date, the machine and the
# source, to the file given (make figures: docs/figures/build.md).
# Usage: figures-build.sh OUT.md LDFLAGS NAME:PKG...
set -euo pipefail
cd "$(dirname "$0")/.."

out=$1 ldflags=$2
shift 2
tmp=$(mktemp -d)
# Go makes the module cache read-only; -modcacherw lets the trap remove it.
trap 'rm -rf "$tmp"' EXIT
export GOMODCACHE=$tmp/mod GOCACHE=$tmp/cache GOFLAGS=-modcacherw NODEPLUG_BIN_DIR=$tmp/bin

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "measuring a cold build of what make run starts (empty module and build caches under $tmp)"
TIMEFORMAT='%R %U %S'
{ time scripts/build.sh "$ldflags" "$@" 2>&1 | tee "$tmp/build.log"; } 2>"$tmp/time"
read -r wall user sys <"$tmp/time"

downloads=$(grep -c '^go: downloading ' "$tmp/build.log" || true)
packages=$(sed -n 's/^  compiled \([0-9]*\) packages in .*/\1/p' "$tmp/build.log" | tail -1)
modules=$(find "$GOMODCACHE/cache/download" -name '*.zip' | wc -l)
mod_mb=$(du -sm "$GOMODCACHE" | cut -f1)
cache_mb=$(du -sm "$GOCACHE" | cut -f1)
names=()
for b in "$@"; do names+=("${b%%:*}"); done

cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
mem_gib=$(awk '/^MemTotal:/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
source=$(git describe --always --dirty 2>/dev/null || echo unknown)

fmt() { awk -v s="$1" 'BEGIN { printf "%.0f", s }'; }
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }

mkdir -p "$(dirname "$out")"
page=$(mktemp "$(dirname "$out")/.figures-XXXXXX.md")
cat >"$page" <<MD
# Measured figures: a cold \`make run\` build

Written by \`make figures\` (scripts/figures-build.sh); do not edit by hand — run it again to renew them.

- **Measured:** $(date -u +%Y-%m-%dT%H:%M:%SZ)
- **Machine:** ${cpu_model:-unknown CPU}, $(nproc) CPUs, ${mem_gib} GiB, $(go version | cut -d' ' -f3-), $(uname -sr); load average before the build: $load_before
- **Source:** $source
- **What:** the build \`make run\` does before it starts the stack (${names[*]}), with an empty module cache and an empty build cache, as on a fresh machine. The module downloads come from the Go module proxy, so the network counts too.

| | |
|---|---|
| modules downloaded | $downloads ($modules module zips, $mod_mb MB in the module cache) |
| packages compiled | $packages |
| CPU time | $(fmt "$user") s user + $(fmt "$sys") s system |
| wall time | $(fmt "$wall") s ($(minutes "$wall") min) |
| build cache left | $cache_mb MB |

A later \`make run\` compiles only what changed: the build cache keeps the rest. On a busy machine the wall time grows with what else runs; the CPU time is the part that does not.
MD
chmod 0644 "$page"
mv -f "$page" "$out"
echo "figures written to $out"
