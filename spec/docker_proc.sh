#!/bin/sh
# docker_proc.sh CMD...: run CMD as nobody with /proc as a container runtime leaves it. Root only,
# inside `unshare -m -p -f --mount-proc --propagation private` (a /proc of its own PID namespace,
# as a container's is). The paths are moby's defaults (oci/defaults.go): the masked ones hidden
# (a read-only empty tmpfs over a directory, /dev/null over a file), the others read-only. The
# kernel then refuses a fresh proc mount in a user namespace (this /proc is not fully visible).
set -eu
for p in /proc/asound /proc/acpi /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list \
         /proc/timer_stats /proc/sched_debug /proc/scsi; do
  if [ -d "$p" ]; then mount -t tmpfs -o ro tmpfs "$p"; elif [ -e "$p" ]; then mount --bind /dev/null "$p"; fi
done
for p in /proc/bus /proc/fs /proc/irq /proc/sys /proc/sysrq-trigger; do
  if [ -e "$p" ]; then mount --bind "$p" "$p" && mount -o remount,bind,ro "$p"; fi
done
exec setpriv --reuid nobody --regid nogroup --clear-groups --reset-env env HOME=/tmp PATH=/usr/bin:/bin "$@"
