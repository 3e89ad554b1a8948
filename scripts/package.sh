#!/usr/bin/env bash
# Builds nodeplug's Debian packages (make package) into dist/: for each
# architecture, the services and nodeplugctl cross-compiled with the
# package's version in their --version, and their man pages, then nfpm
# with packaging/nfpm.yaml.
# Usage: package.sh NFPM VERSION ARCH...
# NODEPLUG_PACKAGER=rpm builds RPMs instead; NODEPLUG_DIST_DIR writes
# elsewhere than dist/.
set -euo pipefail
cd "$(dirname "$0")/.."

nfpm=$1 version=$2
shift 2
packager=${NODEPLUG_PACKAGER:-deb}
ldflags="-s -w -X github.com/nodeplug/nodeplug/pkg/version.Version=$version"
dist=${NODEPLUG_DIST_DIR:-dist}
mkdir -p "$dist"
# The man pages, from the references make docs generates (docs/reference/).
rm -rf "$dist/man"
go run ./internal/manpages -version "$version" -out "$dist/man"
manabs=$(realpath "$dist/man")
# nodeplugctl's bash completion (static: it asks the installed nodeplugctl).
go run ./cmd/nodeplugctl completion bash > "$dist/man/nodeplugctl.bash"
for arch in "$@"; do
  bin=$dist/bin-linux-$arch
  GOOS=linux GOARCH=$arch NODEPLUG_BIN_DIR=$bin scripts/build.sh "$ldflags" \
    nodeplug-watcher:./services/watcher \
    nodeplug-reconciler:./services/reconciler \
    nodeplug-devicemanager:./services/devicemanager \
    nodeplug-dramanager:./services/dramanager \
    nodeplug-apiserver:./services/apiserver \
    nodeplugctl:./cmd/nodeplugctl
  # nfpm reads the files the config names from the working directory.
  binabs=$(realpath "$bin") distabs=$(realpath "$dist")
  (cd packaging && NODEPLUG_VERSION=$version NODEPLUG_ARCH=$arch NODEPLUG_BIN=$binabs NODEPLUG_MAN=$manabs \
    "$nfpm" package --config nfpm.yaml --packager "$packager" --target "$distabs/")
done
ls -l "$dist"/*."$packager"
