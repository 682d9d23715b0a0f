#!/usr/bin/env bash
# Runs a local three-node Strand cluster on loopback: builds the release
# binary once, starts config/cluster/node{1,2,3}.properties (clients on
# 127.0.0.1:9092, :9094, :9096; data in ./data/cluster/node-N), prefixes each
# node's output with its name, and on Ctrl-C (SIGINT) or SIGTERM sends
# SIGTERM to all three (a graceful shutdown each) and waits for them.
# If one node exits on its own, the others are stopped too.
#
#   config/cluster/run.sh
#   kcat -b 127.0.0.1:9092 -L        # in another terminal: three brokers
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release
bin="${CARGO_TARGET_DIR:-target}/release/strand"
nodes=(node1 node2 node3)
# No colour codes in the log lines unless they go to a terminal.
if [[ ! -t 1 ]]; then export NO_COLOR=1; fi
pids=()
stopping=0

stop_all() {
    trap '' INT TERM
    if ((stopping)); then return; fi
    stopping=1
    echo "run.sh: stopping ${nodes[*]}" >&2
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
}
trap 'stop_all' INT TERM

for name in "${nodes[@]}"; do
    # The prefixing sed ignores Ctrl-C so that it outlives its node and
    # prints the node's last (shutdown) lines; it ends at the node's EOF.
    "$bin" "config/cluster/$name.properties" \
        > >(trap '' INT TERM; exec sed -u "s/^/[$name] /") 2>&1 &
    pids+=($!)
done
echo "run.sh: started ${nodes[*]} (pids ${pids[*]}); Ctrl-C stops all three" >&2

status=0
remaining=${#pids[@]}
while ((remaining > 0)); do
    # wait -n returns when any node exits, or early (status > 128) when a
    # signal arrives; in both cases the trap or the check below runs.
    code=0
    wait -n "${pids[@]}" 2>/dev/null || code=$?
    if ((code == 127)); then
        break # no child left
    fi
    alive=()
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); fi
    done
    if ((${#alive[@]} < remaining)); then
        # A node ended: its status is in $code (unless a signal interrupted).
        if ((code != 0 && code <= 128)); then status=$code; fi
        if ((${#alive[@]} > 0)); then stop_all; fi
    fi
    remaining=${#alive[@]}
done
wait
echo "run.sh: all nodes exited" >&2
exit "$status"
