#!/usr/bin/env bash
# Builds Docker Compose from the Go module proxy and installs it as a Docker
# CLI plugin, for machines whose only Compose is Debian's docker-compose 1.29
# (which fails to recreate containers on current engines).
# Usage: build-compose.sh VERSION DEST
set -euo pipefail
version=$1
dest=$2
dir=$(go mod download -json "github.com/docker/compose/v5@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "could not download github.com/docker/compose/v5@$version"; exit 1; }
mkdir -p "$(dirname "$dest")"
# Build inside the module so its own go.mod (with its replace directives) applies.
(cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$version" -o "$dest" ./cmd)
docker compose version
