#!/bin/sh
# ferrok installer: `curl -sfL <url>/install.sh | sh -` installs and starts
# a server; with FERROK_URL=https://SERVER:6443 and FERROK_TOKEN=… (or
# FERROK_TOKEN_FILE) it installs and starts an agent that joins it.
# Arguments after `sh -s -` are ferrok's: `sh -s - server --tls-san x`.
#
# Environment:
#   INSTALL_FERROK_VERSION       release to download (default: the latest)
#   INSTALL_FERROK_DOWNLOAD_URL  folder holding ferrok-<arch> and
#                                sha256sum-<arch>.txt (default: the release
#                                folder of INSTALL_FERROK_VERSION)
#   INSTALL_FERROK_SKIP_DOWNLOAD true: use the binary already at
#                                $INSTALL_FERROK_BIN_DIR/ferrok
#   INSTALL_FERROK_BIN_DIR       where ferrok and the scripts go (/usr/local/bin)
#   INSTALL_FERROK_EXEC          subcommand (server or agent) and flags
#   INSTALL_FERROK_NAME          service name ferrok-<name> (default: ferrok
#                                for a server, ferrok-agent for an agent)
#   INSTALL_FERROK_SKIP_START    true: do not start the service
#   INSTALL_FERROK_SKIP_ENABLE   true: neither enable nor start it
#   INSTALL_FERROK_SYMLINK       skip, force, or (default) link kubectl to
#                                ferrok when there is no kubectl in PATH
#   INSTALL_FERROK_SKIP_PACKAGES true: do not install host packages
#   INSTALL_FERROK_INIT          systemd, openrc or sysv (default: the one
#                                running; sysv, an /etc/init.d script, when
#                                neither runs)
#   INSTALL_FERROK_ROOT          for tests: a folder every file the installer
#                                writes, and every path the service uses, is
#                                under; the service is neither enabled nor started
#   FERROK_CONFIG_FILE           ferrok's config file (/etc/ferrok/config.yaml)
#   FERROK_*                     written to the service's environment file
set -e
set -f

info() { echo "[INFO]  $*"; }
warn() { echo "[WARN]  $*" >&2; }
fatal() {
    echo "error: $*" >&2
    exit 1
}

is_true() { [ "${1:-}" = true ]; }

# --- the host -------------------------------------------------------------

verify_system() {
    INIT=${INSTALL_FERROK_INIT:-}
    case "$INIT" in
        systemd | openrc | sysv) ;;
        "")
            if [ -x /sbin/openrc-run ]; then
                INIT=openrc
            elif [ -d /run/systemd/system ]; then
                INIT=systemd
            else
                INIT=sysv
            fi
            ;;
        *) fatal "INSTALL_FERROK_INIT=$INIT: expected systemd, openrc or sysv" ;;
    esac
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || fatal "run as root (or install sudo)"
        SUDO=sudo
    fi
}

setup_verify_arch() {
    ARCH=$(uname -m)
    case "$ARCH" in
        amd64 | x86_64) ARCH=amd64 ;;
        arm64 | aarch64) ARCH=arm64 ;;
        armv7* | armhf | arm) ARCH=arm ;;
        *) fatal "unsupported architecture $ARCH (ferrok is built for x86_64, aarch64 and armv7)" ;;
    esac
}

# --- what to install --------------------------------------------------------

# $1 with each argument quoted for a shell or systemd when it needs it.
quote_args() {
    out=""
    for arg in "$@"; do
        case "$arg" in
            *"'"* | *'
'*) fatal "INSTALL_FERROK_EXEC: an argument may not contain a quote or a newline: $arg" ;;
            "" | *[!A-Za-z0-9_./:=,@%+-]*) arg="'$arg'" ;;
        esac
        out="$out${out:+ }$arg"
    done
    echo "$out"
}

setup_env() {
    # shellcheck disable=SC2086
    set -- ${INSTALL_FERROK_EXEC:-} "$@"
    case "${1:-}" in
        server | agent)
            CMD=$1
            shift
            ;;
        -*| "")
            if [ -n "${FERROK_URL:-}" ]; then CMD=agent; else CMD=server; fi
            ;;
        *) fatal "INSTALL_FERROK_EXEC: $1 is not a ferrok command (server or agent)" ;;
    esac
    if [ "$CMD" = agent ]; then
        server_given=false
        for arg in "$@"; do
            case "$arg" in --server | --server=* | -s) server_given=true ;; esac
        done
        if [ -n "${FERROK_URL:-}" ]; then
            case "$FERROK_URL" in
                https://*) ;;
                *) fatal "FERROK_URL=$FERROK_URL: only https:// URLs are supported" ;;
            esac
        elif ! $server_given; then
            fatal "an agent needs FERROK_URL (the server's https:// URL)"
        fi
        if [ -z "${FERROK_TOKEN:-}" ] && [ -z "${FERROK_TOKEN_FILE:-}" ]; then
            case " $* " in
                *" --token"* | *" -t "*) ;;
                *) fatal "an agent needs FERROK_TOKEN or FERROK_TOKEN_FILE (the server's <data-dir>/server/token)" ;;
            esac
        fi
    fi

    ROOT=${INSTALL_FERROK_ROOT:-}
    ROOT=${ROOT%/}
    case "$ROOT" in
        "" | /*) ;;
        *) fatal "INSTALL_FERROK_ROOT=$ROOT: must be an absolute path" ;;
    esac
    if [ -n "$ROOT" ]; then
        [ -d "$ROOT" ] || fatal "INSTALL_FERROK_ROOT=$ROOT: no such folder"
        INSTALL_FERROK_SKIP_ENABLE=true
    fi

    if [ -n "${INSTALL_FERROK_NAME:-}" ]; then
        SYSTEM_NAME=ferrok-${INSTALL_FERROK_NAME}
    elif [ "$CMD" = agent ]; then
        SYSTEM_NAME=ferrok-agent
    else
        SYSTEM_NAME=ferrok
    fi
    case "$SYSTEM_NAME" in
        *[!A-Za-z0-9_.-]*) fatal "INSTALL_FERROK_NAME=$INSTALL_FERROK_NAME: letters, digits, '.', '_' and '-' only" ;;
    esac

    BIN_DIR=${INSTALL_FERROK_BIN_DIR:-$ROOT/usr/local/bin}
    SYSTEMD_DIR=$ROOT/etc/systemd/system
    INIT_DIR=$ROOT/etc/init.d
    ETC_DIR=$ROOT/etc/ferrok
    LOG_FILE=$ROOT/var/log/$SYSTEM_NAME.log
    PID_FILE=$ROOT/var/run/$SYSTEM_NAME.pid
    KILLALL_SH=$BIN_DIR/ferrok-killall.sh
    UNINSTALL_SH=$BIN_DIR/$SYSTEM_NAME-uninstall.sh
    if [ "$INIT" = systemd ]; then
        SERVICE_FILE=$SYSTEMD_DIR/$SYSTEM_NAME.service
        ENV_FILE=$SYSTEMD_DIR/$SYSTEM_NAME.service.env
    else
        SERVICE_FILE=$INIT_DIR/$SYSTEM_NAME
        ENV_FILE=$ETC_DIR/$SYSTEM_NAME.env
    fi
    CONFIG_FILE=${FERROK_CONFIG_FILE:-$ROOT/etc/ferrok/config.yaml}

    # What the service's flags (and its config file) say about where
    # things are: killall and the uninstaller act on exactly these.
    DATA_DIR=""
    CLUSTER_CIDR=""
    CGROUP_ROOT=""
    if [ -f "$CONFIG_FILE" ]; then
        DATA_DIR=$(sed -n 's/^data-dir:[[:space:]]*//p' "$CONFIG_FILE" | tr -d "\"'")
        CLUSTER_CIDR=$(sed -n 's/^cluster-cidr:[[:space:]]*//p' "$CONFIG_FILE" | tr -d "\"'")
    fi
    prev=""
    for arg in "$@"; do
        case "$prev" in
            --data-dir | -d) DATA_DIR=$arg ;;
            --cluster-cidr) CLUSTER_CIDR=$arg ;;
            --kubelet-arg) case "$arg" in cgroup-root=*) CGROUP_ROOT=${arg#cgroup-root=} ;; esac ;;
        esac
        case "$arg" in
            --data-dir=*) DATA_DIR=${arg#--data-dir=} ;;
            --cluster-cidr=*) CLUSTER_CIDR=${arg#--cluster-cidr=} ;;
            --kubelet-arg=cgroup-root=*) CGROUP_ROOT=${arg#--kubelet-arg=cgroup-root=} ;;
        esac
        prev=$arg
    done
    # The pods' logs are in /var/log/pods only for a root install on the default data dir.
    POD_LOGS_DIR=""
    if [ -z "$DATA_DIR" ]; then
        if [ -n "$ROOT" ]; then
            DATA_DIR=$ROOT/var/lib/ferrok
            set -- "$@" --data-dir "$DATA_DIR"
        else
            DATA_DIR=/var/lib/ferrok
            POD_LOGS_DIR=/var/log/pods
        fi
    fi
    case "$DATA_DIR" in
        /?*) ;;
        *) fatal "--data-dir $DATA_DIR: the service needs an absolute path" ;;
    esac
    DATA_DIR=${DATA_DIR%/}
    CLUSTER_CIDR=${CLUSTER_CIDR:-10.42.0.0/16}
    CGROUP_ROOT=${CGROUP_ROOT:-/kubepods}
    EXEC_ARGS=$(quote_args "$CMD" "$@") || exit 1
}

# --- the binary ---------------------------------------------------------------

download() {
    if command -v curl >/dev/null 2>&1; then
        curl -sfL -o "$1" "$2" || fatal "cannot download $2 (curl exit $?)"
    elif command -v wget >/dev/null 2>&1; then
        wget -q -O "$1" "$2" || fatal "cannot download $2 (wget exit $?)"
    else
        fatal "curl or wget is needed to download $2"
    fi
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | awk '{ print $1 }'
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | awk '{ print $1 }'
    elif command -v openssl >/dev/null 2>&1; then
        openssl dgst -sha256 "$1" | awk '{ print $NF }'
    else
        fatal "sha256sum, shasum or openssl is needed to verify the download"
    fi
}

download_and_verify() {
    if is_true "${INSTALL_FERROK_SKIP_DOWNLOAD:-}"; then
        [ -x "$BIN_DIR/ferrok" ] || fatal "INSTALL_FERROK_SKIP_DOWNLOAD=true but there is no ferrok at $BIN_DIR/ferrok"
        info "using the ferrok already at $BIN_DIR/ferrok"
        return
    fi
    setup_verify_arch
    if [ -n "${INSTALL_FERROK_DOWNLOAD_URL:-}" ]; then
        URL=${INSTALL_FERROK_DOWNLOAD_URL%/}
    elif [ -n "${INSTALL_FERROK_VERSION:-}" ]; then
        URL=https://github.com/ferrok/ferrok/releases/download/$INSTALL_FERROK_VERSION
    else
        URL=https://github.com/ferrok/ferrok/releases/latest/download
    fi
    info "downloading ferrok-$ARCH from $URL"
    download "$TMP_DIR/sha256sum.txt" "$URL/sha256sum-$ARCH.txt"
    expected=$(awk -v f="ferrok-$ARCH" '$2 == f || $2 == "*" f { print $1 }' "$TMP_DIR/sha256sum.txt")
    [ -n "$expected" ] || fatal "no checksum for ferrok-$ARCH in $URL/sha256sum-$ARCH.txt"
    download "$TMP_DIR/ferrok" "$URL/ferrok-$ARCH"
    actual=$(sha256_of "$TMP_DIR/ferrok")
    [ "$expected" = "$actual" ] || fatal "checksum mismatch for $URL/ferrok-$ARCH: expected $expected, got $actual; nothing was installed"
    chmod 755 "$TMP_DIR/ferrok"
    "$TMP_DIR/ferrok" --version >/dev/null 2>&1 || fatal "the downloaded ferrok-$ARCH does not run on this host"
    NEW_BINARY=$TMP_DIR/ferrok
}

install_binary() {
    [ -n "${NEW_BINARY:-}" ] || return 0
    make_dir "$BIN_DIR"
    if [ -f "$BIN_DIR/ferrok" ] && [ "$(sha256_of "$BIN_DIR/ferrok")" = "$(sha256_of "$NEW_BINARY")" ]; then
        info "$BIN_DIR/ferrok is already this version"
        return
    fi
    $SUDO cp "$NEW_BINARY" "$BIN_DIR/ferrok.new"
    $SUDO chmod 755 "$BIN_DIR/ferrok.new"
    $SUDO mv -f "$BIN_DIR/ferrok.new" "$BIN_DIR/ferrok"
    info "installed $("$BIN_DIR/ferrok" --version) to $BIN_DIR/ferrok"
}

# --- host packages ------------------------------------------------------------

has_cni_plugins() {
    for dir in /usr/lib/cni /opt/cni/bin /usr/libexec/cni; do
        [ -x "$dir/bridge" ] && return 0
    done
    return 1
}

install_host_packages() {
    if is_true "${INSTALL_FERROK_SKIP_PACKAGES:-}"; then
        return
    fi
    if command -v apt-get >/dev/null 2>&1; then
        manager=apt cni=containernetworking-plugins iproute=iproute2
    elif command -v dnf >/dev/null 2>&1; then
        manager=dnf cni=containernetworking-plugins iproute=iproute
    elif command -v apk >/dev/null 2>&1; then
        manager=apk cni=cni-plugins iproute=iproute2
    else
        manager=""
    fi
    missing=""
    command -v containerd >/dev/null 2>&1 || missing="$missing containerd"
    command -v runc >/dev/null 2>&1 || missing="$missing runc"
    has_cni_plugins || missing="$missing ${cni:-containernetworking-plugins}"
    command -v nft >/dev/null 2>&1 || missing="$missing nftables"
    command -v ip >/dev/null 2>&1 || missing="$missing ${iproute:-iproute2}"
    if [ -z "$missing" ]; then
        info "host packages present: containerd, runc, CNI plugins, nftables, iproute2"
        return
    fi
    [ -n "$manager" ] || fatal "missing:$missing; install them (no apt-get, dnf or apk here)"
    info "installing with $manager:$missing"
    # shellcheck disable=SC2086
    case "$manager" in
        apt)
            $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || fatal "apt-get update failed"
            $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null || fatal "apt-get install$missing failed"
            ;;
        dnf) $SUDO dnf install -y -q $missing >/dev/null || fatal "dnf install$missing failed" ;;
        apk) $SUDO apk add -q $missing >/dev/null || fatal "apk add$missing failed" ;;
    esac
    info "installed:$missing"
}

# --- files --------------------------------------------------------------------

# mkdir -p that remembers which folders it made, for the uninstaller.
make_dir() {
    [ -d "$1" ] && return 0
    make_dir "$(dirname "$1")"
    $SUDO mkdir "$1"
    CREATED_DIRS="$1${CREATED_DIRS:+ }${CREATED_DIRS:-}"
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# The templates below are packaging/'s files, word for word (a test
# compares them); render fills in this install's values.
render() {
    sed -e "s|@SYSTEM_NAME@|$(sed_escape "$SYSTEM_NAME")|g" \
        -e "s|@BIN_DIR@|$(sed_escape "$BIN_DIR")|g" \
        -e "s|@EXEC@|$(sed_escape "$1")|g" \
        -e "s|@ENV_FILE@|$(sed_escape "$ENV_FILE")|g" \
        -e "s|@LOG_FILE@|$(sed_escape "$LOG_FILE")|g" \
        -e "s|@PID_FILE@|$(sed_escape "$PID_FILE")|g" \
        -e "s|@DATA_DIR@|$(sed_escape "$DATA_DIR")|g" \
        -e "s|@CLUSTER_CIDR@|$(sed_escape "$CLUSTER_CIDR")|g" \
        -e "s|@CGROUP_ROOT@|$(sed_escape "$CGROUP_ROOT")|g" \
        -e "s|@SYSTEMD_DIR@|$(sed_escape "$SYSTEMD_DIR")|g" \
        -e "s|@INIT_DIR@|$(sed_escape "$INIT_DIR")|g" \
        -e "s|@ROOT@|$(sed_escape "$ROOT")|g" \
        -e "s|@INIT@|$(sed_escape "$INIT")|g" \
        -e "s|@ETC_DIR@|$(sed_escape "$ETC_DIR")|g" \
        -e "s|@KILLALL_SH@|$(sed_escape "$KILLALL_SH")|g" \
        -e "s|@UNINSTALL_SH@|$(sed_escape "$UNINSTALL_SH")|g" \
        -e "s|@SERVICE_FILE@|$(sed_escape "$SERVICE_FILE")|g" \
        -e "s|@POD_LOGS_DIR@|$(sed_escape "$POD_LOGS_DIR")|g" \
        -e "s|@CREATED_DIRS@|$(sed_escape "$CREATED_DIRS")|g"
}

# Installs the file $1 (made in $TMP_DIR) as $2 with mode $3.
put_file() {
    make_dir "$(dirname "$2")"
    $SUDO cp "$1" "$2.new"
    $SUDO chmod "$3" "$2.new"
    $SUDO mv -f "$2.new" "$2"
}

create_symlinks() {
    case "${INSTALL_FERROK_SYMLINK:-}" in
        skip) return ;;
        force) ;;
        "") command -v kubectl >/dev/null 2>&1 && return ;;
        *) fatal "INSTALL_FERROK_SYMLINK=$INSTALL_FERROK_SYMLINK: expected skip or force" ;;
    esac
    if [ -e "$BIN_DIR/kubectl" ] && [ ! -L "$BIN_DIR/kubectl" ] && [ "${INSTALL_FERROK_SYMLINK:-}" != force ]; then
        return
    fi
    info "linking $BIN_DIR/kubectl to ferrok"
    $SUDO ln -sf ferrok "$BIN_DIR/kubectl"
}

create_killall() {
    info "writing $KILLALL_SH"
    render "" >"$TMP_DIR/killall" <<'KILLALL_EOF'
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
KILLALL_EOF
    put_file "$TMP_DIR/killall" "$KILLALL_SH" 755
}

create_uninstall() {
    info "writing $UNINSTALL_SH"
    # A reinstall keeps the folders an earlier install made.
    if [ -f "$UNINSTALL_SH" ]; then
        earlier=$(sed -n "s/^CREATED_DIRS='\(.*\)'\$/\1/p" "$UNINSTALL_SH")
        for dir in $earlier; do
            case " ${CREATED_DIRS:-} " in
                *" $dir "*) ;;
                *) CREATED_DIRS="${CREATED_DIRS:-}${CREATED_DIRS:+ }$dir" ;;
            esac
        done
    fi
    render "" >"$TMP_DIR/uninstall" <<'UNINSTALL_EOF'
#!/bin/sh
# @SYSTEM_NAME@-uninstall.sh (written by install.sh): stops everything with
# ferrok-killall.sh, then removes the service, the data, the binaries and
# this script, leaving nothing ferrok made behind.
set -u
SYSTEM_NAME='@SYSTEM_NAME@'
INIT='@INIT@'
ROOT='@ROOT@'
BIN_DIR='@BIN_DIR@'
DATA_DIR='@DATA_DIR@'
ETC_DIR='@ETC_DIR@'
POD_LOGS_DIR='@POD_LOGS_DIR@'
SERVICE_FILE='@SERVICE_FILE@'
ENV_FILE='@ENV_FILE@'
LOG_FILE='@LOG_FILE@'
PID_FILE='@PID_FILE@'
SYSTEMD_DIR='@SYSTEMD_DIR@'
INIT_DIR='@INIT_DIR@'
KILLALL_SH='@KILLALL_SH@'
UNINSTALL_SH='@UNINSTALL_SH@'
# Folders install.sh made, deepest first: removed when left empty.
CREATED_DIRS='@CREATED_DIRS@'

if [ "$(id -u)" -ne 0 ]; then
    echo "error: $0 must run as root" >&2
    exit 1
fi
if [ -x "$KILLALL_SH" ]; then
    "$KILLALL_SH"
fi

if [ -z "$ROOT" ] && [ "$INIT" = systemd ] && [ -d /run/systemd/system ]; then
    systemctl disable "$SYSTEM_NAME" >/dev/null 2>&1
    systemctl reset-failed "$SYSTEM_NAME" >/dev/null 2>&1
fi
if [ -z "$ROOT" ] && [ "$INIT" = openrc ] && command -v rc-update >/dev/null 2>&1; then
    rc-update delete "$SYSTEM_NAME" default >/dev/null 2>&1
fi
if [ -z "$ROOT" ] && [ "$INIT" = sysv ]; then
    if command -v update-rc.d >/dev/null 2>&1; then
        update-rc.d -f "$SYSTEM_NAME" remove >/dev/null 2>&1
    elif command -v chkconfig >/dev/null 2>&1; then
        chkconfig --del "$SYSTEM_NAME" >/dev/null 2>&1
    fi
fi
echo "removing $SERVICE_FILE $ENV_FILE"
rm -f "$SERVICE_FILE" "$ENV_FILE" "$LOG_FILE" "$PID_FILE" "$UNINSTALL_SH"
if [ -z "$ROOT" ] && [ "$INIT" = systemd ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi

remove_created_dirs() {
    for dir in $CREATED_DIRS; do
        rmdir "$dir" 2>/dev/null
    done
    return 0
}

# Another ferrok service on this host (a server and an agent) keeps the
# binary, the data and the scripts they share.
for other in "$SYSTEMD_DIR"/ferrok*.service "$INIT_DIR"/ferrok*; do
    if [ -f "$other" ]; then
        echo "$other remains: keeping $BIN_DIR/ferrok and $DATA_DIR"
        remove_created_dirs
        exit 0
    fi
done

if [ -L "$BIN_DIR/kubectl" ] && [ "$(readlink "$BIN_DIR/kubectl")" = ferrok ]; then
    rm -f "$BIN_DIR/kubectl"
fi
if awk -v d="$DATA_DIR" 'index($5, d "/") == 1 || $5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    echo "error: something is still mounted under $DATA_DIR; not removing it" >&2
    exit 1
fi
echo "removing $DATA_DIR $ETC_DIR $POD_LOGS_DIR"
rm -rf "$DATA_DIR" "$ETC_DIR"
if [ -n "$POD_LOGS_DIR" ]; then
    rm -rf "$POD_LOGS_DIR"
fi
echo "removing $BIN_DIR/ferrok $KILLALL_SH"
rm -f "$BIN_DIR/ferrok" "$KILLALL_SH"
remove_created_dirs
exit 0
UNINSTALL_EOF
    put_file "$TMP_DIR/uninstall" "$UNINSTALL_SH" 755
}

create_env_file() {
    info "writing $ENV_FILE"
    env | grep '^FERROK_[A-Z0-9_]*=' | grep -v '^FERROK_CONFIG_FILE=' >"$TMP_DIR/env.in" || true
    (umask 077 && echo "# The environment of the $SYSTEM_NAME service (written by install.sh)." >"$TMP_DIR/env")
    while IFS='=' read -r name value; do
        case "$value" in
            *"'"*) fatal "$name: a value with a single quote cannot go into $ENV_FILE" ;;
        esac
        echo "$name='$value'" >>"$TMP_DIR/env"
    done <"$TMP_DIR/env.in"
    if [ -n "${FERROK_CONFIG_FILE:-}" ] || [ -n "$ROOT" ]; then
        echo "FERROK_CONFIG_FILE='$CONFIG_FILE'" >>"$TMP_DIR/env"
    fi
    put_file "$TMP_DIR/env" "$ENV_FILE" 600
}

# systemd: each argument as systemd reads it ($ and % doubled).
systemd_exec() { printf '%s\n' "$EXEC_ARGS" | sed -e 's/\$/$$/g' -e 's/%/%%/g'; }
# OpenRC and sysv: inside double quotes.
openrc_exec() { printf '%s\n' "$EXEC_ARGS" | sed -e 's/[\\"$`]/\\&/g'; }

create_service_file() {
    info "writing $SERVICE_FILE"
    if [ "$INIT" = systemd ]; then
        render "$(systemd_exec)" >"$TMP_DIR/service" <<'SYSTEMD_EOF'
[Unit]
Description=ferrok: Kubernetes in one executable (@SYSTEM_NAME@)
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=exec
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-@ENV_FILE@
# Only ferrok is stopped with the service: it stops its containerd itself,
# and the pods' shims live on until ferrok-killall.sh.
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
TimeoutStopSec=30s
Restart=always
RestartSec=5s
ExecStart=@BIN_DIR@/ferrok @EXEC@
SYSTEMD_EOF
        put_file "$TMP_DIR/service" "$SERVICE_FILE" 644
    elif [ "$INIT" = openrc ]; then
        render "$(openrc_exec)" >"$TMP_DIR/service" <<'OPENRC_EOF'
#!/sbin/openrc-run
# shellcheck shell=sh disable=SC2034,SC1090,SC1091
# @SYSTEM_NAME@: ferrok, Kubernetes in one executable.

depend() {
    after network-online
    want cgroups
}

supervisor=supervise-daemon
name=@SYSTEM_NAME@
command="@BIN_DIR@/ferrok"
command_args="@EXEC@"
output_log="@LOG_FILE@"
error_log="@LOG_FILE@"
pidfile="@PID_FILE@"
respawn_delay=5
respawn_max=0

set -a
if [ -f /etc/environment ]; then . /etc/environment; fi
if [ -f "@ENV_FILE@" ]; then . "@ENV_FILE@"; fi
set +a
OPENRC_EOF
        put_file "$TMP_DIR/service" "$SERVICE_FILE" 755
    else
        render "$(openrc_exec)" >"$TMP_DIR/service" <<'SYSV_EOF'
#!/bin/sh
### BEGIN INIT INFO
# Provides:          @SYSTEM_NAME@
# Required-Start:    $local_fs $remote_fs $network
# Required-Stop:     $local_fs $remote_fs $network
# Default-Start:     2 3 4 5
# Default-Stop:      0 1 6
# Short-Description: ferrok, Kubernetes in one executable
# Description:       @SYSTEM_NAME@ (written by install.sh) for hosts
#                    without systemd or OpenRC.
### END INIT INFO
# shellcheck shell=sh disable=SC1090,SC1091,SC2119,SC2120
# Only ferrok is stopped with the service: it stops its containerd itself,
# and the pods' shims live on until ferrok-killall.sh. Nothing restarts
# ferrok should it exit.

NAME='@SYSTEM_NAME@'
COMMAND="@BIN_DIR@/ferrok"
COMMAND_ARGS="@EXEC@"
LOG_FILE="@LOG_FILE@"
PID_FILE="@PID_FILE@"
ENV_FILE="@ENV_FILE@"
# Seconds ferrok has to stop after SIGTERM before SIGKILL.
STOP_TIMEOUT=30

set -a
if [ -f /etc/environment ]; then . /etc/environment; fi
if [ -f "$ENV_FILE" ]; then . "$ENV_FILE"; fi
set +a

# The pid in the pid file, if that process is this install's ferrok.
running_pid() {
    [ -f "$PID_FILE" ] || return 1
    pid=$(cat "$PID_FILE" 2>/dev/null)
    case "$pid" in
        "" | *[!0-9]*) return 1 ;;
    esac
    case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in
        "$COMMAND" | "$COMMAND (deleted)") echo "$pid" ;;
        *) return 1 ;;
    esac
}

do_start() {
    if pid=$(running_pid); then
        echo "$NAME is already running (pid $pid)"
        return 0
    fi
    mkdir -p "$(dirname "$LOG_FILE")" "$(dirname "$PID_FILE")" || return 1
    rm -f "$PID_FILE"
    eval "set -- $COMMAND_ARGS"
    echo "Starting $NAME"
    if command -v start-stop-daemon >/dev/null 2>&1; then
        # A shell that appends ferrok's output to the log and becomes ferrok
        # (same pid, the one in the pid file); $0 of that shell is the log.
        # shellcheck disable=SC2016
        start-stop-daemon --start --quiet --background --make-pidfile --pidfile "$PID_FILE" \
            --startas /bin/sh -- -c 'exec "$@" >>"$0" 2>&1 </dev/null' "$LOG_FILE" "$COMMAND" "$@" || return 1
    else
        "$COMMAND" "$@" >>"$LOG_FILE" 2>&1 </dev/null &
        echo "$!" >"$PID_FILE"
    fi
    # Started once the pid file names ferrok itself (the shell has become it).
    tries=0
    until running_pid >/dev/null; do
        tries=$((tries + 1))
        if [ "$tries" -gt 50 ]; then
            echo "$NAME did not start: see $LOG_FILE" >&2
            return 1
        fi
        sleep 0.1 2>/dev/null || sleep 1
    done
    return 0
}

do_stop() {
    if ! pid=$(running_pid); then
        echo "$NAME is not running"
        rm -f "$PID_FILE"
        return 0
    fi
    echo "Stopping $NAME"
    if command -v start-stop-daemon >/dev/null 2>&1; then
        start-stop-daemon --stop --quiet --pidfile "$PID_FILE" --retry "TERM/$STOP_TIMEOUT/KILL/5"
    else
        kill -TERM "$pid" 2>/dev/null
        tries=0
        while kill -0 "$pid" 2>/dev/null; do
            if [ "$tries" -ge "$STOP_TIMEOUT" ]; then
                kill -KILL "$pid" 2>/dev/null
                break
            fi
            sleep 1
            tries=$((tries + 1))
        done
    fi
    rm -f "$PID_FILE"
    return 0
}

do_status() {
    if pid=$(running_pid); then
        echo "$NAME is running (pid $pid)"
        return 0
    fi
    if [ -f "$PID_FILE" ]; then
        echo "$NAME is not running, but $PID_FILE exists"
        return 1
    fi
    echo "$NAME is not running"
    return 3
}

case "${1:-}" in
    start) do_start ;;
    stop) do_stop ;;
    restart | force-reload)
        do_stop
        do_start
        ;;
    status) do_status ;;
    *)
        echo "usage: $0 {start|stop|restart|force-reload|status}" >&2
        exit 2
        ;;
esac
SYSV_EOF
        put_file "$TMP_DIR/service" "$SERVICE_FILE" 755
    fi
}

# The folders the service writes in, made now so that the uninstaller
# knows they are ferrok's.
create_service_dirs() {
    make_dir "$(dirname "$DATA_DIR")"
    make_dir "$(dirname "$LOG_FILE")"
    make_dir "$(dirname "$PID_FILE")"
}

service_enable_and_start() {
    if is_true "${INSTALL_FERROK_SKIP_ENABLE:-}"; then
        if [ -n "$ROOT" ]; then
            info "INSTALL_FERROK_ROOT: $SERVICE_FILE is neither enabled nor started"
        fi
        return
    fi
    if [ "$INIT" = systemd ]; then
        $SUDO systemctl daemon-reload
        info "enabling $SYSTEM_NAME"
        $SUDO systemctl enable "$SYSTEM_NAME" >/dev/null
        is_true "${INSTALL_FERROK_SKIP_START:-}" && return
        info "starting $SYSTEM_NAME"
        $SUDO systemctl restart "$SYSTEM_NAME"
    elif [ "$INIT" = openrc ]; then
        info "enabling $SYSTEM_NAME"
        $SUDO rc-update add "$SYSTEM_NAME" default >/dev/null
        is_true "${INSTALL_FERROK_SKIP_START:-}" && return
        info "starting $SYSTEM_NAME"
        $SUDO rc-service "$SYSTEM_NAME" restart
    else
        if command -v update-rc.d >/dev/null 2>&1; then
            info "enabling $SYSTEM_NAME"
            $SUDO update-rc.d "$SYSTEM_NAME" defaults >/dev/null
        elif command -v chkconfig >/dev/null 2>&1; then
            info "enabling $SYSTEM_NAME"
            $SUDO chkconfig --add "$SYSTEM_NAME" >/dev/null
        else
            warn "neither update-rc.d nor chkconfig: have your init run $SERVICE_FILE start at boot"
        fi
        is_true "${INSTALL_FERROK_SKIP_START:-}" && return
        info "starting $SYSTEM_NAME"
        $SUDO "$SERVICE_FILE" restart
    fi
}

# --- main ---------------------------------------------------------------------

main() {
    verify_system
    setup_env "$@"
    TMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ferrok-install.XXXXXXXX")
    trap 'rm -rf "$TMP_DIR"' EXIT
    download_and_verify
    install_host_packages
    CREATED_DIRS=""
    install_binary
    create_symlinks
    create_service_dirs
    create_env_file
    create_service_file
    create_killall
    create_uninstall
    service_enable_and_start
    if [ "$CMD" = server ]; then
        if [ -n "$POD_LOGS_DIR" ]; then kubeconfig=$ETC_DIR/ferrok.yaml; else kubeconfig=$DATA_DIR/kubeconfig.yaml; fi
        info "admin kubeconfig: $kubeconfig; agents join with the token in $DATA_DIR/server/token"
    fi
    if is_true "${INSTALL_FERROK_SKIP_ENABLE:-}" || is_true "${INSTALL_FERROK_SKIP_START:-}"; then
        info "not started: $SERVICE_FILE runs $BIN_DIR/ferrok $EXEC_ARGS"
    fi
    info "$SYSTEM_NAME installed; stop everything with $KILLALL_SH, remove it with $UNINSTALL_SH"
}

main "$@"
