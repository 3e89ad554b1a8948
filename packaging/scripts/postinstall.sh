#!/bin/sh
# nodeplug's postinst: its groups and directories, then the units. A first
# install enables and starts nodeplug.target; an upgrade restarts the
# services that were running, one at a time, each from its own journal.
set -e
if [ -d /run/systemd/system ]; then
  systemd-sysusers nodeplug.conf
  systemd-tmpfiles --create nodeplug.conf
  systemctl daemon-reload
  case "$1" in
    configure|1|2)
      if [ -z "$2" ] || [ "$1" = 1 ]; then
        systemctl enable nodeplug.target nodeplug-watcher.service nodeplug-reconciler.service \
          nodeplug-devicemanager.service nodeplug-dramanager.service nodeplug-apiserver.service
        systemctl start nodeplug.target
      else
        for s in apiserver dramanager devicemanager watcher reconciler; do
          systemctl try-restart "nodeplug-$s.service"
        done
      fi
      ;;
  esac
else
  # No systemd running (a container, a chroot): the groups and directories
  # only, where the tools are.
  command -v systemd-sysusers >/dev/null 2>&1 && systemd-sysusers nodeplug.conf || true
  command -v systemd-tmpfiles >/dev/null 2>&1 && systemd-tmpfiles --create nodeplug.conf || true
fi
exit 0
