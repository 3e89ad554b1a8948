#!/usr/bin/env bash
# Printed by `make up`: where to look at the compose stack.
cat <<INFO

nodeplug is up in containers (docker compose -p ${COMPOSE_PROJECT:-nodeplug}).

  APIs      Unix sockets in /var/lib/kubelet/nodeplug/ on the stack's volume
  podres    /var/lib/kubelet/pod-resources/kubelet.sock on the stack's volume, nodeplug_kubelet (the kubelet's pod resources API)
  metrics   http://127.0.0.1:${NODEPLUG_WATCHER_METRICS_PORT:-9451}/metrics  http://127.0.0.1:${NODEPLUG_RECONCILER_METRICS_PORT:-9452}/metrics  http://127.0.0.1:${NODEPLUG_DEVICEMANAGER_METRICS_PORT:-9453}/metrics
  traces    Jaeger query API http://127.0.0.1:${NODEPLUG_JAEGER_PORT:-16686}/api/services

  docker compose -p ${COMPOSE_PROJECT:-nodeplug} run --rm nodeplugctl plugins
  docker compose -p ${COMPOSE_PROJECT:-nodeplug} run --rm nodeplugctl resources
  bin/nodeplugctl trace <trace id from 'nodeplugctl plugins -o json'>

Stop it with: make down
INFO
