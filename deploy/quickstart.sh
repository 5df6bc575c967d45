#!/usr/bin/env bash
# Quickstart: Portcullis driving a real HAProxy on the example manifests in
# deploy/examples/quickstart, with echo servers standing in for the pods.
#
#   deploy/quickstart.sh [DEMO FLAGS...]
#
# Installs HAProxy with apt-get when it is not on PATH, then runs `portcullis demo` with the
# given flags (see `cargo run -- demo --help`).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian installs HAProxy in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin"
if ! command -v haproxy >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "quickstart: HAProxy 2.6 or newer is needed; install it and run this again" >&2
        exit 1
    fi
    as_root() { "$@"; }
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "quickstart: HAProxy is missing and installing it needs root (no sudo found)" >&2
            exit 1
        fi
        as_root() { sudo "$@"; }
    fi
    echo "quickstart: installing HAProxy with apt-get" >&2
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y haproxy
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "quickstart: cargo is needed (https://rustup.rs)" >&2
    exit 1
fi

exec cargo run --release -- demo "$@"
