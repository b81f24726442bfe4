#!/usr/bin/env bash
# Runs N computerd nodes as local processes on loopback (node 1 bootstraps, the others join it).
#
#   deploy/local-cluster.sh [N] [DIR]     default N=3, DIR=./computerd-cluster
#
# Ports: HTTP 18080+i, gRPC 19080+i (override the bases with HTTP_BASE / GRPC_BASE).
# Logs go to DIR/nodeI.log; the owner token is DIR/node1/admin.token. Ctrl-C stops all nodes.
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
  if [ "$i" -gt 1 ]; then join=(--join "127.0.0.1:$((grpc_base + 1))"); fi
  "$bin" serve --node-id "$i" --data "$dir/node$i" \
    --http "127.0.0.1:$((http_base + i))" --grpc "127.0.0.1:$((grpc_base + i))" "${join[@]}" \
    2>"$dir/node$i.log" &
  pids+=($!)
  if [ "$i" -eq 1 ]; then
    for _ in $(seq 1 200); do [ -s "$dir/node1/admin.token" ] && break; sleep 0.05; done
  fi
done
echo "computerd: $n nodes; HTTP on 127.0.0.1:$((http_base + 1))..$((http_base + n)); token in $dir/node1/admin.token"
wait
