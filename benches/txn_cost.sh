#!/usr/bin/env bash
# Cost of idempotence and transactions: the same produce workload in three
# producer modes against ONE release broker, interleaved A B C, A B C, ...
#
#   A plain          acks=all, enable.idempotence=false
#   B idempotent     acks=all, enable.idempotence=true
#   C transactional  acks=all, transactional.id, a commit every COMMIT_MS ms
#
# Each run writes to a fresh topic (and C uses a fresh transactional.id), so
# no run appends to segments or producer state left by another. Each run
# first produces one untimed warm-up record (committed, in mode C) so the
# connection, metadata and producer id (InitProducerId) are outside the clock
# in every mode, as init_transactions is. Every run's
# JSON line (loadgen's, plus "round") goes to stdout; loadgen's human lines
# and progress go to stderr; the summary (median records/s and MB/s per mode
# and partition count, and the ratios to plain) goes to stdout at the end.
#
# Usage: benches/txn_cost.sh            (from the repository root or anywhere)
# Knobs (environment): RECORDS=300000 RECORD_SIZE=1024 PARTITIONS="1 8"
#   ROUNDS=3 COMMIT_MS=100 LINGER_MS=5 BATCH_SIZE=1000000 QUEUE_KBYTES=32768
set -euo pipefail

RECORDS=${RECORDS:-300000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PARTITIONS=${PARTITIONS:-"1 8"}
ROUNDS=${ROUNDS:-3}
COMMIT_MS=${COMMIT_MS:-100}
LINGER_MS=${LINGER_MS:-5}
BATCH_SIZE=${BATCH_SIZE:-1000000}
# A bounded client buffer (the Java client's buffer.memory default, 32 MiB):
# sends wait for deliveries, so a 100 ms transaction holds about 100 ms of
# traffic instead of the whole run being enqueued into the first one.
QUEUE_KBYTES=${QUEUE_KBYTES:-32768}

cd "$(dirname "$0")/.."

echo "building release broker and loadgen..." >&2
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo build --release --bin strand >&2
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo build --release --features loadgen --bin strand-loadgen >&2

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strand-txn-cost.XXXXXX")
BROKER_PID=
cleanup() {
    if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill "$BROKER_PID" 2>/dev/null || true
        wait "$BROKER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BOOTSTRAP=127.0.0.1:$PORT
target/release/strand --config config/server.properties \
    --override "log.dirs=$WORK/data" \
    --override "listeners=PLAINTEXT://$BOOTSTRAP" \
    --override "advertised.listeners=PLAINTEXT://$BOOTSTRAP" \
    >"$WORK/broker.log" 2>&1 &
BROKER_PID=$!
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
    kill -0 "$BROKER_PID" 2>/dev/null || { echo "broker exited:" >&2; cat "$WORK/broker.log" >&2; exit 1; }
    sleep 0.1
done
echo "broker pid $BROKER_PID on $BOOTSTRAP, data in $WORK/data; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

LOADGEN=target/release/strand-loadgen
COMMON=(--bootstrap "$BOOTSTRAP" --records "$RECORDS" --record-size "$RECORD_SIZE" --acks all
    --compression none --linger-ms "$LINGER_MS" --batch-size "$BATCH_SIZE" --queue-kbytes "$QUEUE_KBYTES"
    --warmup --mode produce)
MODES=(plain idempotent transactional)
RESULTS=$WORK/results.tsv # partitions, mode, round, records/s, MB/s

run() { # partitions mode round
    local p=$1 mode=$2 round=$3 topic="txn-cost-p$1-$2-r$3" extra=() out
    case $mode in
    plain) ;;
    idempotent) extra=(--idempotent) ;;
    transactional) extra=(--transactional-id "txn-cost-p$p-r$round" --commit-interval-ms "$COMMIT_MS") ;;
    esac
    if ! out=$("$LOADGEN" "${COMMON[@]}" --topic "$topic" --partitions "$p" "${extra[@]}" 2>"$WORK/loadgen.err"); then
        echo "FAILED: partitions=$p mode=$mode round=$round" >&2
        echo "$out" >&2
        cat "$WORK/loadgen.err" >&2
        echo "--- broker log (last 40 lines) ---" >&2
        tail -n 40 "$WORK/broker.log" >&2
        exit 1
    fi
    local human json
    human=$(grep -v '^{' <<<"$out")
    json=$(grep '^{' <<<"$out")
    echo "[round $round] $human" >&2
    echo "${json%\}},\"round\":$round,\"loadavg_1m\":$(cut -d' ' -f1 /proc/loadavg)}"
    python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(j["records_per_sec"], j["mb_per_sec"], sep="\t")' \
        "$json" | sed "s/^/$p\t$mode\t$round\t/" >>"$RESULTS"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
    for p in $PARTITIONS; do
        for mode in "${MODES[@]}"; do
            run "$p" "$mode" "$round"
        done
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

median() { # values on stdin, one per line
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "# $RECORDS records x $RECORD_SIZE B, acks=all, linger.ms=$LINGER_MS, batch.size=$BATCH_SIZE," \
    "queue.buffering.max.kbytes=$QUEUE_KBYTES, commit every $COMMIT_MS ms; $ROUNDS rounds; medians"
echo "# load average before: $LOAD_BEFORE, after: $LOAD_AFTER"
printf '# %-10s %-14s %12s %9s %14s  %s\n' partitions mode records/s MB/s ratio_to_plain "runs (records/s)"
for p in $PARTITIONS; do
    plain=$(awk -F'\t' -v p="$p" '$1 == p && $2 == "plain" { print $4 }' "$RESULTS" | median)
    for mode in "${MODES[@]}"; do
        rps=$(awk -F'\t' -v p="$p" -v m="$mode" '$1 == p && $2 == m { print $4 }' "$RESULTS" | median)
        mbps=$(awk -F'\t' -v p="$p" -v m="$mode" '$1 == p && $2 == m { print $5 }' "$RESULTS" | median)
        runs=$(awk -F'\t' -v p="$p" -v m="$mode" '$1 == p && $2 == m { printf "%s%.0f", sep, $4; sep = " / " }' "$RESULTS")
        printf '# %-10s %-14s %12.0f %9.1f %14.3f  %s\n' "$p" "$mode" "$rps" "$mbps" \
            "$(awk -v a="$rps" -v b="$plain" 'BEGIN { print a / b }')" "$runs"
    done
done
