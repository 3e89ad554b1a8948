#!/usr/bin/env bash
# Runs the test suite while a CPU hog keeps both cores busy, to prove that
# no test depends on a quiet machine (make stress-test).
#
#   full (default): make test three times in a row, then every package of
#                   both modules (the root module and test/upstream) with
#                   -count=20 (the e2e package, which runs whole stacks and
#                   compose, with -count=3);
#   SHORT=1:        the packages that start processes or servers, -count=3
#                   (what CI runs), test/upstream's among them.
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

stress-ng --cpu "$CPUS" --timeout 0 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
echo "CPU hog: stress-ng --cpu $CPUS (pid $hog)"

run() { echo "==> $*"; "$@"; }

if [ "${SHORT:-}" = 1 ]; then
  # The packages whose tests start processes, sockets and servers: where
  # timing assumptions would show.
  run go test -race -count=3 -timeout "$TIMEOUT" \
    ./services/... ./pkg/access/... ./pkg/app/... ./internal/sampleplugin/... ./cmd/... \
    ./internal/conform/... ./internal/chaos/...
  # test/upstream is a module of its own: ./... above does not reach it.
  run go -C test/upstream test -race -count=3 -timeout "$TIMEOUT" ./...
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
