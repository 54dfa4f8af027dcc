#!/bin/sh
# ferrok-killall.sh: stops ferrok, every pod it runs, their shims and its
# containerd; unmounts what they mounted under the data dir; removes
# ferrok's nftables table `inet ferrok`, its bridge, VXLAN device and pod
# links, its routes into the cluster CIDR and the pods' cgroups. The data
# stays (the uninstaller removes it). Acts only on this install: the paths
# below were filled in when it was written.
set -u

BIN='@BIN_DIR@/ferrok'
DATA_DIR='@DATA_DIR@'
CLUSTER_CIDR='@CLUSTER_CIDR@'
CGROUP_ROOT='@CGROUP_ROOT@'
SYSTEMD_DIR='@SYSTEMD_DIR@'
INIT_DIR='@INIT_DIR@'
# Empty unless this is a relocated install (INSTALL_FERROK_ROOT), whose
# services the host's init system does not know.
ROOT='@ROOT@'

if [ "$(id -u)" -ne 0 ]; then
    echo "error: $0 must run as root" >&2
    exit 1
fi

pause() { sleep 0.2 2>/dev/null || sleep 1; }

# The services first, so that nothing restarts what is stopped below.
if [ -z "$ROOT" ]; then
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        for unit in "$SYSTEMD_DIR"/ferrok*.service; do
            [ -s "$unit" ] && systemctl stop "${unit##*/}"
        done
    fi
    for script in "$INIT_DIR"/ferrok*; do
        [ -x "$script" ] || continue
        case "$(head -n 1 "$script")" in
            *openrc-run*) command -v rc-service >/dev/null 2>&1 && rc-service "${script##*/}" stop ;;
            *) "$script" stop ;;
        esac
    done
fi

# Processes whose executable is $1.
pids_of_exe() {
    for p in /proc/[0-9]*; do
        case "$(readlink "$p/exe" 2>/dev/null)" in
            "$1" | "$1 (deleted)") echo "${p#/proc/}" ;;
        esac
    done
}

# Processes whose command line contains $1 and $2.
pids_with_args() {
    for p in /proc/[0-9]*; do
        cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
        case "$cmdline" in
            *"$1"*"$2"* | *"$2"*"$1"*) echo "${p#/proc/}" ;;
        esac
    done
}

# "pid ppid" for every process.
process_table() {
    for p in /proc/[0-9]*; do
        ppid=$(sed -n 's/^PPid:[[:space:]]*//p' "$p/status" 2>/dev/null) && [ -n "$ppid" ] && echo "${p#/proc/} $ppid"
    done
}

# The given processes and all their descendants.
with_descendants() {
    [ $# -gt 0 ] || return 0
    process_table | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            changed = 1
            while (changed) {
                changed = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
            }
            for (p in keep) print p
        }'
}

alive() {
    state=$(sed -n 's/^State:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null) || return 1
    case "$state" in
        "" | Z* | X*) return 1 ;;
    esac
    return 0
}

# Sends $1 to the processes $2..., then SIGKILL to those left after $TIMEOUT pauses.
stop_processes() {
    signal=$1
    shift
    [ $# -gt 0 ] || return 0
    kill "-$signal" "$@" 2>/dev/null
    tries=0
    while [ "$tries" -lt "$TIMEOUT" ]; do
        left=""
        for pid in "$@"; do
            alive "$pid" && left="$left $pid"
        done
        [ -n "$left" ] || return 0
        pause
        tries=$((tries + 1))
    done
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
    return 0
}

# ferrok itself: SIGTERM lets it stop its containerd and close the store.
TIMEOUT=75
# shellcheck disable=SC2046
stop_processes TERM $(pids_of_exe "$BIN")

# The pods: their shims and everything under them.
TIMEOUT=25
# shellcheck disable=SC2046
stop_processes KILL $(with_descendants $(pids_with_args containerd-shim "$DATA_DIR/"))

# containerd, if ferrok did not stop it (killed, or started by hand).
# shellcheck disable=SC2046
stop_processes TERM $(pids_with_args containerd "$DATA_DIR/")

# Mounts under the data dir (rootfs overlays, pod volumes, network
# namespaces), deepest first.
awk -v d="$DATA_DIR" 'index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r mount; do
    umount "$mount" 2>/dev/null || umount -l "$mount" 2>/dev/null || echo "warning: cannot unmount $mount" >&2
done

# CNI's cached results of this install's pod sandboxes (`<network>-<id>-<if>`).
for sandbox in "$DATA_DIR"/agent/containerd/io.containerd.grpc.v1.cri/sandboxes/*; do
    [ -e "$sandbox" ] || continue
    rm -f /var/lib/cni/results/*-"${sandbox##*/}"-*
done

# The network: ferrok's nftables table, its links, its routes.
if command -v nft >/dev/null 2>&1 && nft list table inet ferrok >/dev/null 2>&1; then
    nft delete table inet ferrok
fi
if command -v ip >/dev/null 2>&1; then
    ip -o link show master ferrok0 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | while read -r link; do
        ip link delete "$link" 2>/dev/null
    done
    for link in ferrok0 ferrok.1; do
        if ip link show "$link" >/dev/null 2>&1; then
            ip link delete "$link"
        fi
    done
    ip route show root "$CLUSTER_CIDR" 2>/dev/null | while read -r route; do
        # shellcheck disable=SC2086
        ip route del $route 2>/dev/null
    done
fi

# The pods' cgroups runc leaves behind (only empty ones go).
case "$CGROUP_ROOT" in
    "" | /) ;;
    *)
        for cgroup in /sys/fs/cgroup/*"$CGROUP_ROOT" /sys/fs/cgroup"$CGROUP_ROOT"; do
            [ -d "$cgroup" ] && find "$cgroup" -depth -type d -exec rmdir {} \; 2>/dev/null
        done
        ;;
esac
exit 0
