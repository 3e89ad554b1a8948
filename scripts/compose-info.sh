#!/usr/bin/env bash
# Printed by `make up`: where to look at the compose stack.
project=${COMPOSE_PROJECT:-nodeplug}
# The console prints its token at start; the last start's is the one.
token=$(docker compose -p "$project" logs --no-log-prefix console 2>/dev/null | sed -n 's/.*?token=\([0-9a-f]*\).*/\1/p' | tail -1)
cat <<INFO

nodeplug is up in containers (docker compose -p ${COMPOSE_PROJECT:-nodeplug}).

  APIs      Unix sockets in /var/lib/kubelet/nodeplug/ on the stack's volume
  podres    /var/lib/kubelet/pod-resources/kubelet.sock on the stack's volume, nodeplug_kubelet (the kubelet's pod resources API)
  metrics   http://127.0.0.1:${NODEPLUG_WATCHER_METRICS_PORT:-9451}/metrics  http://127.0.0.1:${NODEPLUG_RECONCILER_METRICS_PORT:-9452}/metrics  http://127.0.0.1:${NODEPLUG_DEVICEMANAGER_METRICS_PORT:-9453}/metrics  http://127.0.0.1:${NODEPLUG_APISERVER_METRICS_PORT:-9454}/metrics
  resource API  nodeplug-apiserver, https://127.0.0.1:6446 inside its network namespace (DRA drivers join it: network_mode "service:apiserver"; their kubeconfig is /var/lib/kubelet/nodeplug/kubeconfig on the volume)
  console   http://127.0.0.1:${NODEPLUG_CONSOLE_PORT:-8080}/?token=${token:-(not printed yet: docker compose -p $project logs console)}
  traces    Jaeger query API http://127.0.0.1:${NODEPLUG_JAEGER_PORT:-16686}/api/traces?service=nodeplug-watcher (and /api/services); the console shows them

  docker compose -p ${COMPOSE_PROJECT:-nodeplug} run --rm nodeplugctl plugins
  docker compose -p ${COMPOSE_PROJECT:-nodeplug} run --rm nodeplugctl resources
  docker compose -p ${COMPOSE_PROJECT:-nodeplug} run --rm nodeplugctl trace <trace id from 'nodeplugctl plugins'>
  bin/nodeplugctl --jaeger-url http://127.0.0.1:${NODEPLUG_JAEGER_PORT:-16686} trace <trace id>

Stop it with: make down
INFO
