# Container images for nodeplug. Every image is built FROM scratch from the
# static binaries that `make build` puts in bin/ (and Jaeger, which
# `make images` builds into bin/images/): no base image is pulled.
# Build with `make images`; run with `make up`.
#
# The APIs are Unix sockets in /var/lib/kubelet/nodeplug/ on the shared
# volume; the metrics listen on all interfaces inside the container so that
# compose can publish them, on the host's loopback only.

FROM scratch AS watcher
COPY bin/nodeplug-watcher /nodeplug-watcher
ENV NODEPLUG_WATCHER_METRICS_LISTEN=0.0.0.0:9451
ENTRYPOINT ["/nodeplug-watcher"]

FROM scratch AS reconciler
COPY bin/nodeplug-reconciler /nodeplug-reconciler
ENV NODEPLUG_RECONCILER_METRICS_LISTEN=0.0.0.0:9452
ENTRYPOINT ["/nodeplug-reconciler"]

FROM scratch AS devicemanager
COPY bin/nodeplug-devicemanager /nodeplug-devicemanager
ENV NODEPLUG_DEVICEMANAGER_METRICS_LISTEN=0.0.0.0:9453
ENTRYPOINT ["/nodeplug-devicemanager"]

# The DRA half: DRA drivers, their slices and the pods' claims. In compose
# it shares the apiserver's network namespace, to reach the node-local
# resource API on loopback.
FROM scratch AS dramanager
COPY bin/nodeplug-dramanager /nodeplug-dramanager
ENV NODEPLUG_DRAMANAGER_METRICS_LISTEN=0.0.0.0:9455
ENTRYPOINT ["/nodeplug-dramanager"]

# The node-local resource API. It serves on loopback only; in compose the
# dramanager (and DRA drivers) share its network namespace.
FROM scratch AS apiserver
COPY bin/nodeplug-apiserver /nodeplug-apiserver
ENV NODEPLUG_APISERVER_METRICS_LISTEN=0.0.0.0:9454
ENTRYPOINT ["/nodeplug-apiserver"]

FROM scratch AS sampleplugin
COPY bin/nodeplug-sampleplugin /nodeplug-sampleplugin
ENTRYPOINT ["/nodeplug-sampleplugin"]

FROM scratch AS nodeplugctl
COPY bin/nodeplugctl /nodeplugctl
ENTRYPOINT ["/nodeplugctl"]

# The web console: loopback inside the container is not reachable through a
# published port, so it listens on all interfaces there; compose publishes
# it on the host's 127.0.0.1 only, and its Host check admits loopback names.
FROM scratch AS console
COPY bin/nodeplug-console /nodeplug-console
ENV NODEPLUG_CONSOLE_LISTEN=0.0.0.0:8080
ENTRYPOINT ["/nodeplug-console"]

FROM scratch AS jaeger
COPY bin/images/jaeger /jaeger
# For the healthcheck: `nodeplugctl healthcheck jaeger` (no shell, no curl).
COPY bin/nodeplugctl /nodeplugctl
ENTRYPOINT ["/jaeger"]
