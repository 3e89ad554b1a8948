#!/usr/bin/env bash
# make test: every test of both modules under the race detector. The root
# module's packages run TEST_P at a time (default 4: on 2 cores most of the
# suite waits on processes, sockets and fsync rather than computing), and
# test/upstream, a module of its own, runs beside them; its output follows
# the root module's. Exits non-zero when either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
timeout=${TEST_TIMEOUT:-45m}
p=${TEST_P:-4}

upstream_log=$(mktemp)
trap 'rm -f "$upstream_log"' EXIT
go -C test/upstream test -race -count=1 -timeout "$timeout" ./... >"$upstream_log" 2>&1 &
upstream=$!

echo "==> go test -race -count=1 -p $p ./... (test/upstream runs beside it; its output follows)"
go test -race -count=1 -p "$p" -timeout "$timeout" ./...
root=$?

wait "$upstream"
up=$?
echo "==> go -C test/upstream test -race -count=1 ./..."
cat "$upstream_log"

if [ "$root" != 0 ] || [ "$up" != 0 ]; then
  echo "make test: FAILED (root module exit $root, test/upstream exit $up)" >&2
  exit 1
fi
