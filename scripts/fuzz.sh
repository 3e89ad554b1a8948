#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx) for FUZZTIME each
# (make fuzz FUZZTIME=30s). Their seed corpora also run as ordinary tests in
# make test; this explores beyond them. New failing inputs are written under
# the package's testdata/fuzz/ by go test: commit them as regression seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}

targets=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  # Fuzz targets live in test files; skip packages without any.
  grep -lq '^func Fuzz' "$dir"/*_test.go 2>/dev/null || continue
  for fn in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "==> $pkg $fn ($FUZZTIME)"
    go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$FUZZTIME" "$pkg"
    targets=$((targets + 1))
  done
done
echo "fuzzed $targets targets for $FUZZTIME each"
