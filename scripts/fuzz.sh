#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx) for FUZZTIME each
# (make fuzz FUZZTIME=30s). Their seed corpora also run as ordinary tests in
# make test; this explores beyond them. New failing inputs are written under
# the package's testdata/fuzz/ by go test: commit them as regression seeds.
#
# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime runs out while a worker is mid-call on a busy machine
# (go.dev/issue/75804, fixed in Go 1.27). That is not a finding: no input is
# written and nothing failed. Such a run is retried once; a real finding
# (a failing input written, a panic, a t.Fatal) fails at once, and a second
# bare deadline fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# only_deadline: the log of a failed run shows the coordinator's deadline and
# nothing else that failed.
only_deadline() {
  grep -q 'context deadline exceeded' "$log" || return 1
  ! grep -Eq 'Failing input written|panic:|_test\.go:[0-9]+:|testdata/fuzz/' "$log"
}

targets=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  # Fuzz targets live in test files; skip packages without any.
  grep -lq '^func Fuzz' "$dir"/*_test.go 2>/dev/null || continue
  for fn in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    for attempt in 1 2; do
      echo "==> $pkg $fn ($FUZZTIME)"
      if go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$log"; then
        break
      fi
      if [ "$attempt" = 1 ] && only_deadline; then
        echo "==> $fn: the fuzz coordinator's deadline race (go.dev/issue/75804), no finding; running it again"
        continue
      fi
      exit 1
    done
    targets=$((targets + 1))
  done
done
echo "fuzzed $targets targets for $FUZZTIME each"
