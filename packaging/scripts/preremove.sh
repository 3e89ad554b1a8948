#!/bin/sh
# nodeplug's prerm: on removal (not on upgrade) stop and disable the
# services. Their state stays until purge.
set -e
case "$1" in
  remove|0)
    if [ -d /run/systemd/system ]; then
      systemctl stop nodeplug.target || true
      systemctl disable nodeplug.target nodeplug-watcher.service nodeplug-reconciler.service \
        nodeplug-devicemanager.service nodeplug-dramanager.service nodeplug-apiserver.service || true
    fi
    ;;
esac
exit 0
