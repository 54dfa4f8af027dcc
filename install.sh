#!/bin/sh
# Installs the ferrok binary: `curl -sfL <url>/install.sh | sh -`.
# FERROK_BINARY=/path/to/ferrok installs a local build instead of
# downloading FERROK_URL. Installs to ${INSTALL_DIR:-/usr/local/bin}.
set -eu
INSTALL_DIR=${INSTALL_DIR:-/usr/local/bin}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
fail() { echo "install.sh: $*" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${FERROK_BINARY:-}" ]; then
    [ -f "$FERROK_BINARY" ] || fail "FERROK_BINARY=$FERROK_BINARY is not a file"
    cp "$FERROK_BINARY" "$tmp/ferrok"
else
    [ -n "${FERROK_URL:-}" ] || fail "set FERROK_URL to the ferrok binary for $(uname -m), or FERROK_BINARY to a local build"
    command -v curl >/dev/null 2>&1 || fail "curl is needed to download $FERROK_URL"
    curl -sfL "$FERROK_URL" -o "$tmp/ferrok" || fail "cannot download $FERROK_URL"
fi
chmod 0755 "$tmp/ferrok"
"$tmp/ferrok" --version >/dev/null 2>&1 || fail "the binary does not run on this machine ($(uname -m))"
$SUDO install -m 0755 "$tmp/ferrok" "$INSTALL_DIR/ferrok"
echo "installed $("$INSTALL_DIR/ferrok" --version) to $INSTALL_DIR/ferrok"
