#!/usr/bin/env bash
# Prints the package version of the checkout (make package): a tag vX.Y.Z
# gives X.Y.Z (with git describe's +N-gHASH after it when past the tag);
# without a tag, 0.0.0+git<commit time>.<hash>, which grows with each
# commit, so a package built later upgrades one built before.
set -euo pipefail
cd "$(dirname "$0")/.."
if d=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
  d=${d#v}
  echo "${d/-/+}" | tr - .
else
  echo "0.0.0+git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git rev-parse --short HEAD)"
fi
