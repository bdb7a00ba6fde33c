#!/usr/bin/env bash
# A Ray head and one worker node on this machine, on loopback only, with token authentication:
#   bash scripts/ray_cluster.sh start [PORT]   # then: hybrid serve --ray 127.0.0.1:PORT --index SHARDED_INDEX
#   bash scripts/ray_cluster.sh stop
# On real machines run the head's line on one and the worker's on each other (with --node-ip-address set to
# the machine's own address and the same ~/.ray/auth_token copied to every node).
set -euo pipefail
cd "$(dirname "$0")/.."
ray=.venv/bin/ray
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
port="${2:-6379}"
case "${1:-}" in
  start)
    "$ray" get-auth-token --generate >/dev/null  # ~/.ray/auth_token, read by every process of the cluster
    "$ray" start --head --node-ip-address=127.0.0.1 --port="$port" --num-cpus=1 --include-dashboard=false --disable-usage-stats
    "$ray" start --address="127.0.0.1:$port" --node-ip-address=127.0.0.1 --num-cpus=1
    echo "Ray head and one worker on 127.0.0.1:$port; serve with: RAY_AUTH_MODE=token hybrid serve --ray 127.0.0.1:$port --index DIR"
    ;;
  stop)
    "$ray" stop
    ;;
  *)
    echo "usage: $0 start [PORT] | stop" >&2
    exit 2
    ;;
esac
