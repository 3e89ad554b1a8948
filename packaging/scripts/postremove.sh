#!/bin/sh
# nodeplug's postrm: purge removes nodeplug's own state under the root dir
# (never a kubelet's files there), then forgets the units.
set -e
root=/var/lib/kubelet
case "$1" in
  purge)
    rm -rf "$root/nodeplug" "$root/dra-manager"
    rm -f "$root"/device-plugins/nodeplug_checkpoint* "$root"/nodeplug-*.lock
    ;;
esac
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
exit 0
