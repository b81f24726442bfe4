#!/usr/bin/env bash
# build-node-images.sh: the images of deploy/compose.yaml, built from this host's files with
# `docker import` (no registry is reachable here, so no FROM debian):
#
#   computerd:local          computerd + bash and cat (for the Kubernetes ordinal wrapper, reading the token) and their libraries
#   computerd-haproxy:local  Debian's haproxy and its libraries, with bash, cat and sleep (its entrypoint waits
#                            for the edge certificate that compose's `certs` service makes)
#
# Usage: deploy/build-node-images.sh [--bin PATH]   (default: target/release/computerd, built if missing)
set -euo pipefail
root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin PATH]" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  bin="$root/target/release/computerd"
  [ -x "$bin" ] || (cd "$root" && cargo build --release -q -p computerd-node --bin computerd)
fi
command -v docker >/dev/null || { echo "docker is missing" >&2; exit 1; }
command -v haproxy >/dev/null || { echo "haproxy is missing (apt-get install haproxy)" >&2; exit 1; }

# rootfs DIR FILE...: copies the files (following symlinks) and every library ldd names for them.
rootfs() {
  local dir="$1"; shift
  mkdir -p "$dir"/{etc,tmp,data,usr/bin,usr/sbin,usr/lib,usr/lib64}
  ln -sfn usr/bin "$dir/bin"; ln -sfn usr/sbin "$dir/sbin"; ln -sfn usr/lib "$dir/lib"; ln -sfn usr/lib64 "$dir/lib64"
  chmod 1777 "$dir/tmp"
  printf 'root:x:0:0:root:/root:/bin/bash\n' >"$dir/etc/passwd"
  printf 'root:x:0:\n' >"$dir/etc/group"
  printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
  local f lib
  for f in "$@"; do
    install -D -m 0755 "$(readlink -f "$f")" "$dir/usr/${f#/usr/}"
    for lib in $(ldd "$f" | grep -o '/[^ ]*'); do
      install -D -m 0755 "$(readlink -f "$lib")" "$dir/usr/${lib#/usr/}"
    done
  done
}

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

rootfs "$stage/node" /usr/bin/bash /usr/bin/cat
install -D -m 0755 "$bin" "$stage/node/usr/bin/computerd"
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  install -D -m 0755 "$(readlink -f "$lib")" "$stage/node/usr/${lib#/usr/}"
done
tar -C "$stage/node" -c . | docker import \
  --change 'ENV PATH=/usr/bin:/bin' \
  --change 'WORKDIR /data' \
  --change 'ENTRYPOINT ["/usr/bin/computerd"]' \
  - computerd:local >/dev/null

rootfs "$stage/lb" /usr/sbin/haproxy /usr/bin/bash /usr/bin/cat /usr/bin/sleep
mkdir -p "$stage/lb/etc/haproxy" "$stage/lb/run/haproxy"
tar -C "$stage/lb" -c . | docker import \
  --change 'ENV PATH=/usr/bin:/usr/sbin:/bin' \
  --change 'ENTRYPOINT ["/usr/sbin/haproxy", "-db", "-f", "/etc/haproxy/haproxy.cfg"]' \
  - computerd-haproxy:local >/dev/null

docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^computerd(-haproxy)?:local '
