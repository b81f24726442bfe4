#!/usr/bin/env bash
# Runs N computerd nodes as local processes on loopback (node 1 bootstraps, the others join it),
# and HAProxy in front of them when it is installed (apt-get install haproxy).
#
#   deploy/local-cluster.sh [N] [DIR]     default N=3, DIR=./computerd-cluster
#
# Ports: HTTP 18080+i, gRPC 19080+i (override the bases with HTTP_BASE / GRPC_BASE); the load
# balancer on HTTP_BASE itself (127.0.0.1:18080): point clients and agents there.
# Logs go to DIR/nodeI.log; the owner token is DIR/node1/admin.token. Ctrl-C stops everything.
set -euo pipefail
n=${1:-3}
dir=${2:-computerd-cluster}
http_base=${HTTP_BASE:-18080}
grpc_base=${GRPC_BASE:-19080}
bin=${COMPUTERD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -q -p computerd-node --bin computerd
  bin=target/release/computerd
fi
mkdir -p "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
for i in $(seq 1 "$n"); do
  join=()
  if [ "$i" -gt 1 ]; then join=(--join "127.0.0.1:$((grpc_base + 1))" --join-token-file "$dir/node1/join.token"); fi
  "$bin" serve --node-id "$i" --data "$dir/node$i" \
    --http "127.0.0.1:$((http_base + i))" --grpc "127.0.0.1:$((grpc_base + i))" "${join[@]}" \
    2>"$dir/node$i.log" &
  pids+=($!)
  if [ "$i" -eq 1 ]; then
    for _ in $(seq 1 200); do [ -s "$dir/node1/admin.token" ] && break; sleep 0.05; done
  fi
done
lb=""
if command -v haproxy >/dev/null; then
  {
    printf 'global\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 200ms\n  timeout client 1h\n'
    printf '  timeout server 1h\n  timeout tunnel 1h\n  timeout http-request 30s\n  retries 3\n  option redispatch 1\n'
    printf 'frontend api\n  bind 127.0.0.1:%s\n  default_backend nodes\n' "$http_base"
    printf 'backend nodes\n  balance roundrobin\n  option httpchk GET /v1/health\n'
    printf '  default-server inter 250ms fall 2 rise 1 on-marked-down shutdown-sessions\n'
    # A port address goes to the node holding its link: the rules of haproxy.cfg beside this.
    sed -n '/which read them from here/,/end of the shared lines/p' "$(dirname "$0")/haproxy.cfg" |
      grep -v '^  #' | sed 's/use-server node%/use-server n%/'
    for i in $(seq 1 "$n"); do printf '  server n%s 127.0.0.1:%s check\n' "$i" "$((http_base + i))"; done
  } >"$dir/haproxy.cfg"
  haproxy -db -f "$dir/haproxy.cfg" 2>"$dir/haproxy.log" &
  pids+=($!)
  lb="; load balancer on http://127.0.0.1:$http_base"
fi
echo "computerd: $n nodes; HTTP on 127.0.0.1:$((http_base + 1))..$((http_base + n))$lb; token in $dir/node1/admin.token"
wait
