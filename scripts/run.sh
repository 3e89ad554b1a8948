#!/usr/bin/env bash
# Runs the nodeplug stack as local processes until Ctrl-C (make run).
#
# Everything lives under .run/ in the checkout: the root dir (plugins_registry/,
# device-plugins/), and one log per process in .run/logs/. No root privileges
# and no /var/lib are needed. Ctrl-C (or SIGTERM) stops every process this
# script started; each removes its own sockets. Under make, SIGINT to make
# alone stops it too (make does not pass it on: this script sees make take
# it, in make's signal dispositions, NODEPLUG_RUN_MAKE_PID).
#
# The metrics addresses are the services' defaults unless
# NODEPLUG_<SVC>_METRICS_LISTEN says otherwise (127.0.0.1:0 picks a free
# port); the addresses bound are printed.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-$PWD/bin}
RUN_DIR=${NODEPLUG_RUN_DIR:-$PWD/.run}
ROOT=$RUN_DIR/root
LOGS=$RUN_DIR/logs
GRPCURL=${GRPCURL:-}

# One stack per run dir: a second make run on the same .run/ would relink
# bin/, take the first one's ports, remove its console.json and call its
# live sockets left behind. RUN_PID holds the running script's PID and
# root; --check (make run, before it builds) and the start itself refuse
# while that process lives, touching nothing.
RUN_PID=$RUN_DIR/run.pid
refuse_if_running() {
  local pid root
  [ -f "$RUN_PID" ] || return 0
  read -r pid root <"$RUN_PID" || return 0
  if [ -n "$pid" ] && [ "$pid" != "$$" ] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'scripts/run.sh'; then
    echo "make run: already running (PID $pid, root $root); stop it first (Ctrl-C where it runs, or kill -INT $pid)" >&2
    exit 1
  fi
}
refuse_if_running
if [ "${1:-}" = --check ]; then exit 0; fi
mkdir -p "$ROOT" "$LOGS"
echo "$$ $ROOT" >"$RUN_PID"
export NODEPLUG_ROOT_DIR=$ROOT
# The containers' CDI specs go where the container runtimes look for them
# (/var/run/cdi, the devicemanager's default) when this user may write
# there; else under the root dir, which a runtime must then be told of.
if [ -z "${NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIR:-}" ] && ! { mkdir -p /var/run/cdi 2>/dev/null && [ -w /var/run/cdi ]; }; then
  export NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIR=$ROOT/cdi
fi
CDI_DIR=${NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIR:-/var/run/cdi}

pids=()
names=()
napper=
cleanup() {
  if [ -n "$napper" ]; then kill "$napper" 2>/dev/null || true; fi
  if [ ${#pids[@]} -gt 0 ]; then
    echo
    echo "stopping ${names[*]}"
    # Reverse order: the plugin first, the watcher last.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  fi
  left=$(find "$ROOT" -type s 2>/dev/null || true)
  # A socket something still listens on is not left behind: it is another
  # process's (a plugin started by hand). ss lists the listening ones; where
  # it is missing, every socket is listed.
  if [ -n "$left" ] && command -v ss >/dev/null 2>&1; then
    listening=$(ss -xlH 2>/dev/null | awk '{print $5}' || true)
    if [ -n "$listening" ]; then
      left=$(grep -vxF -e "$listening" <<<"$left" || true)
    fi
  fi
  if [ -n "$left" ]; then echo "warning: sockets left behind (nothing listens on them):"; echo "$left"; fi
  if [ "$(cut -d' ' -f1 "$RUN_PID" 2>/dev/null)" = "$$" ]; then rm -f "$RUN_PID"; fi
}
trap cleanup EXIT
# A stop asked for is a clean stop: exit 0, so that make prints no error.
trap 'exit 0' INT TERM

# make_interrupted reports whether the make that runs this script has taken
# a SIGINT: make's handler resets SIGINT to its default disposition and waits
# for its children, which it does not signal.
make_pid=${NODEPLUG_RUN_MAKE_PID:-}
catches_sigint() {
  local mask
  mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$mask" ] && (((16#$mask & 2) != 0))
}
if [ -n "$make_pid" ] && ! catches_sigint "$make_pid"; then
  make_pid= # make ignores SIGINT (started in the background): nothing to watch
fi
make_interrupted() {
  [ -n "$make_pid" ] && ! catches_sigint "$make_pid"
}

# nap sleeps for $1 seconds, a trapped signal cutting it short, and stops the
# stack when make was interrupted.
nap() {
  if make_interrupted; then
    echo
    echo "make was interrupted"
    exit 0
  fi
  sleep "$1" &
  napper=$!
  wait "$napper" || true
  napper=
}

start() {
  local name=$1
  shift
  "$BIN/$name" "$@" >"$LOGS/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}

wait_healthy() {
  local name=$1 deadline=$((SECONDS + 30))
  until "$BIN/$name" healthcheck >/dev/null 2>&1; do
    if ! kill -0 "${pids[-1]}" 2>/dev/null && [ "$name" = "${names[-1]}" ]; then
      echo "$name exited; its log ($LOGS/$name.log) ends with:"; tail -20 "$LOGS/$name.log"; exit 1
    fi
    if ((SECONDS > deadline)); then
      echo "$name is not healthy after 30s; see $LOGS/$name.log"; tail -20 "$LOGS/$name.log"; exit 1
    fi
    nap 0.2
  done
  echo "  $name is serving"
}

# metrics_addr prints the metrics address a service logged, "off" when it
# serves none.
metrics_addr() {
  local addr
  addr=$(sed -n 's/.*msg="metrics listening" addr=\([^ ]*\).*/\1/p' "$LOGS/$1.log" | tail -1)
  echo "${addr:-off}"
}
metrics_url() {
  local addr
  addr=$(metrics_addr "$1")
  if [ "$addr" = off ]; then echo "off"; else echo "http://$addr/metrics"; fi
}

# resource_api_url prints the address the node-local resource API logged.
resource_api_url() {
  local addr
  addr=$(sed -n 's/.*msg="serving the node-local resource API" addr=\([^ ]*\).*/\1/p' "$LOGS/nodeplug-apiserver.log" | tail -1)
  echo "https://${addr:-?}"
}

# wait_console waits for the console's info file, reads the page's URL and
# token and the receiver's address from it, and points the services at the
# receiver.
console_url=
console_otlp=
wait_console() {
  local file=$ROOT/nodeplug/console.json deadline=$((SECONDS + 30))
  until [ -s "$file" ]; do
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "nodeplug-console exited; its log ($LOGS/nodeplug-console.log) ends with:"; tail -20 "$LOGS/nodeplug-console.log"; exit 1
    fi
    if ((SECONDS > deadline)); then
      echo "nodeplug-console did not start within 30s; see $LOGS/nodeplug-console.log"; exit 1
    fi
    nap 0.2
  done
  field() { sed -n 's/^ *"'"$1"'": "\(.*\)",*$/\1/p' "$file"; }
  console_url="$(field url)/?token=$(field token)"
  console_otlp=$(field otlp)
  if [ -z "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ] && [ -n "$console_otlp" ]; then
    export OTEL_EXPORTER_OTLP_ENDPOINT=http://$console_otlp OTEL_EXPORTER_OTLP_INSECURE=true
    export OTEL_BSP_SCHEDULE_DELAY=${OTEL_BSP_SCHEDULE_DELAY:-500}
  fi
  echo "  nodeplug-console is serving"
}

echo "starting nodeplug under $ROOT"
# The web console first: the services then export their spans to its OTLP
# receiver from their start (unless OTEL_EXPORTER_OTLP_ENDPOINT says
# otherwise). It leaves its URL and token in $ROOT/nodeplug/console.json
# (0600); its log, which prints them too, is kept 0600 as well.
rm -f "$ROOT/nodeplug/console.json"
(umask 077 && : >"$LOGS/nodeplug-console.log")
start nodeplug-console
wait_console
# The node-local resource API before the dramanager, so that the DRA half
# finds it at once (it would follow it whenever it came); both managers
# before the reconciler, which registers plugins with them.
start nodeplug-apiserver
wait_healthy nodeplug-apiserver
start nodeplug-watcher
wait_healthy nodeplug-watcher
start nodeplug-devicemanager
wait_healthy nodeplug-devicemanager
start nodeplug-dramanager
wait_healthy nodeplug-dramanager
start nodeplug-reconciler
wait_healthy nodeplug-reconciler
start nodeplug-sampleplugin --mode plugins-registry --resource example.com/sample --devices 4
echo -n "  waiting for example.com/sample to register"
deadline=$((SECONDS + 30))
until "$BIN/nodeplugctl" resources -o json 2>/dev/null | grep -q '"allocatable": *"\?4'; do
  if ((SECONDS > deadline)); then
    echo; echo "the sample plugin did not register within 30s; logs are in $LOGS"; exit 1
  fi
  echo -n "."
  nap 0.3
done
echo " done"

if [ -n "$GRPCURL" ] && [ -x "$GRPCURL" ]; then
  grpcurl_line="export GRPCURL=$GRPCURL"
else
  grpcurl_line='export GRPCURL=$(make -s grpcurl)   # builds grpcurl once (it takes a while on a cold build cache) and prints its path'
fi

cat <<INFO

nodeplug is running (logs in $LOGS, root dir $ROOT).

  APIs      $ROOT/nodeplug/{watcher,reconciler,devicemanager,dramanager,apiserver}.sock
  resource API  $(resource_api_url) (nodeplug-apiserver: resource.k8s.io for DRA drivers; drivers' kubeconfig $ROOT/nodeplug/kubeconfig)
  podres    $ROOT/pod-resources/kubelet.sock (the kubelet's pod resources API, for monitoring agents)
  CDI specs $CDI_DIR (one per allocated container, for container runtimes)
  metrics   $(metrics_url nodeplug-watcher)  $(metrics_url nodeplug-reconciler)  $(metrics_url nodeplug-devicemanager)  $(metrics_url nodeplug-dramanager)  $(metrics_url nodeplug-apiserver)
  console   $console_url
  traces    exported to ${OTEL_EXPORTER_OTLP_ENDPOINT:-nowhere (the console runs without its receiver)}: open one from the console, or bin/nodeplugctl trace TRACE_ID

Look inside, from another shell in $PWD (nodeplugctl finds the sockets from the root dir):
  export NODEPLUG_ROOT_DIR=$ROOT
  bin/nodeplugctl plugins
  bin/nodeplugctl resources
  bin/nodeplugctl allocate --pod pod-1 --container main example.com/sample=2
  bin/nodeplugctl allocations
  bin/nodeplugctl start --pod pod-1 --container main -o podman   # the runtime's --device arguments
  bin/nodeplugctl watch plugins
  bin/nodeplugctl trace TRACE_ID      # a trace ID from plugins or allocations, read from the console
  $grpcurl_line
  \$GRPCURL -plaintext -unix \$NODEPLUG_ROOT_DIR/nodeplug/watcher.sock list
  \$GRPCURL -plaintext -unix \$NODEPLUG_ROOT_DIR/nodeplug/reconciler.sock nodeplug.reconciler.v1.ReconcilerService/ListPlugins
  \$GRPCURL -plaintext -unix \$NODEPLUG_ROOT_DIR/nodeplug/devicemanager.sock nodeplug.devicemanager.v1.DeviceManagerService/ListResources
  \$GRPCURL -plaintext -unix \$NODEPLUG_ROOT_DIR/pod-resources/kubelet.sock v1.PodResourcesLister/List

Press Ctrl-C to stop.
INFO

# Wait until a process exits (then report it), Ctrl-C or SIGTERM arrives, or
# make is interrupted. A crashed nodeplug-apiserver is started again.
apiserver_restarts=0
while :; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      status=0
      wait "${pids[$i]}" || status=$?
      # Ctrl-C reaches the whole process group: a process that stopped
      # cleanly (status 0, or by SIGINT or SIGTERM) may have done so before
      # this script's own trap ran. That is a stop, not a failure.
      case $status in
      0 | 130 | 143)
        echo
        echo "${names[$i]} stopped (status $status): stopping the rest"
        exit 0
        ;;
      esac
      echo "${names[$i]} exited with status $status; its log ends with:"
      tail -20 "$LOGS/${names[$i]}.log"
      # The node-local resource API is restarted: the rest serves on
      # without it (DRA calls fail, naming it, until it is back).
      if [ "${names[$i]}" = nodeplug-apiserver ] && ((apiserver_restarts < 5)); then
        apiserver_restarts=$((apiserver_restarts + 1))
        echo "restarting nodeplug-apiserver ($apiserver_restarts of at most 5)"
        "$BIN/nodeplug-apiserver" >>"$LOGS/nodeplug-apiserver.log" 2>&1 &
        pids[$i]=$!
        continue
      fi
      exit 1
    fi
  done
  nap 0.5
done
