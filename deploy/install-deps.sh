#!/usr/bin/env bash
# Installs pdserve's build and test dependencies from Debian 12's packages (needs root or sudo).
set -euo pipefail
pkgs="meson ninja-build pkg-config gcc clang libuv1-dev libjansson-dev libyaml-dev libpcre2-dev
libutf8proc-dev libxxhash-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler libucx-dev libcmocka-dev
libsystemd-dev libssl-dev node-llhttp python3-grpcio python3-grpc-tools python3-protobuf python3-yaml curl openssl
prometheus systemd"  # prometheus: promtool, for the cluster_metrics test (`promtool check metrics`);
# systemd: systemd-analyze, for the systemd_units test (`systemd-analyze verify`)
missing=""
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "installing:$missing"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
