#!/usr/bin/env bash
# Runs the test suite while a CPU hog keeps both cores busy, to prove that
# no test depends on a quiet machine (make stress-test).
#
#   full (default): make test three times in a row, then every package of
#                   both modules (the root module and test/upstream) with
#                   -count=20 (the e2e package, which runs whole stacks and
#                   compose, with -count=3);
#   SHORT=1:        the packages that start processes or servers, -count=3,
#                   TEST_P (default 4) at a time, with test/upstream's beside
#                   them (what CI runs).
#
# Needs stress-ng (Debian: apt-get install stress-ng).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v stress-ng >/dev/null; then
  echo "stress-ng is not installed: apt-get install -y stress-ng" >&2
  exit 1
fi
CPUS=${STRESS_CPUS:-$(nproc)}
TIMEOUT=${TEST_TIMEOUT:-60m}
# Packages at a time, as make test runs them (TEST_P).
P=${TEST_P:-4}

stress-ng --cpu "$CPUS" --timeout 0 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
echo "CPU hog: stress-ng --cpu $CPUS (pid $hog)"

run() { echo "==> $*"; "$@"; }

if [ "${SHORT:-}" = 1 ]; then
  # The packages whose tests start processes, sockets and servers: where
  # timing assumptions would show.
  # test/upstream is a module of its own: ./... does not reach it. It runs
  # beside the root module's packages, as in make test; its output follows.
  upstream_log=$(mktemp)
  echo "==> go -C test/upstream test -race -count=3 ./... (beside the next; its output follows)"
  go -C test/upstream test -race -count=3 -timeout "$TIMEOUT" ./... >"$upstream_log" 2>&1 &
  upstream=$!
  status=0
  run go test -race -count=3 -p "$P" -timeout "$TIMEOUT" \
    ./services/... ./pkg/access/... ./pkg/app/... ./internal/sampleplugin/... ./cmd/... \
    ./internal/conform/... ./internal/chaos/... || status=$?
  up=0
  wait "$upstream" || up=$?
  cat "$upstream_log"
  rm -f "$upstream_log"
  if [ "$status" != 0 ] || [ "$up" != 0 ]; then
    echo "stress-test (short) FAILED under the hog (root module exit $status, test/upstream exit $up)" >&2
    exit 1
  fi
  echo "stress-test (short) passed under the hog"
  exit 0
fi

for i in 1 2 3; do
  run make test
done
run go test -race -count=20 -timeout "$TIMEOUT" $(go list ./... | grep -v '/test/e2e$')
run go test -race -count=3 -timeout "$TIMEOUT" ./test/e2e/
# test/upstream is a module of its own: go list ./... above does not list it.
run go -C test/upstream test -race -count=20 -timeout "$TIMEOUT" ./...
echo "stress-test passed under the hog"
