#!/usr/bin/env bash
# Builds Docker Compose from the Go module proxy and installs it as a Docker
# CLI plugin, for machines whose only Compose is Debian's docker-compose 1.29
# (which fails to recreate containers on current engines). DEST is where
# `docker compose` finds it, outside nodeplug's cache: make compose passes
# $DOCKER_CONFIG/cli-plugins/docker-compose (~/.docker/... by default), and
# this script says so when it installs it.
# Usage: build-compose.sh VERSION DEST
set -euo pipefail
version=$1
dest=$2
dir=$(go mod download -json "github.com/docker/compose/v5@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "could not download github.com/docker/compose/v5@$version"; exit 1; }
mkdir -p "$(dirname "$dest")"
# Build inside the module so its own go.mod (with its replace directives) applies.
(cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$version" -o "$dest" ./cmd)
echo "installed Compose $version as the Docker CLI plugin $dest (outside ~/.cache/nodeplug: every 'docker compose' of this user now runs it; remove the file to undo)"
docker compose version
