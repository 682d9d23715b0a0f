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
#   MAX_IN_FLIGHT=5 (applied to every mode: idempotence needs <= 5, so plain
#   gets the same cap and the modes differ only in what is measured)
#   BROKER=strand|kafka (kafka: Apache Kafka 4.1.2, KRaft combined mode, one
#   node, from the jars benches/kafka/pom.xml resolves into benches/kafka/lib
#   (gitignored); needs java 17+ and mvn; KAFKA_HEAP=1g; Kafka's own flush
#   defaults, i.e. no fsync per message, as Strand's default config)
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
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-5}

cd "$(dirname "$0")/.."

BROKER=${BROKER:-strand}
KAFKA_HEAP=${KAFKA_HEAP:-1g}
case $BROKER in
strand | kafka) ;;
*) echo "BROKER must be strand or kafka, not '$BROKER'" >&2; exit 2 ;;
esac

if [[ $BROKER == strand ]]; then
    echo "building release broker and loadgen..." >&2
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo build --release --bin strand >&2
else
    echo "building release loadgen; resolving Apache Kafka jars (benches/kafka/pom.xml)..." >&2
    KAFKA_LIB=$PWD/benches/kafka/lib
    (cd benches/kafka && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$KAFKA_LIB" >&2)
fi
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

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT=$(free_port)
BOOTSTRAP=127.0.0.1:$PORT
if [[ $BROKER == strand ]]; then
    target/release/strand --config config/server.properties \
        --override "log.dirs=$WORK/data" \
        --override "listeners=PLAINTEXT://$BOOTSTRAP" \
        --override "advertised.listeners=PLAINTEXT://$BOOTSTRAP" \
        >"$WORK/broker.log" 2>&1 &
    BROKER_PID=$!
    WAIT_STEPS=100 # x 0.1 s
else
    CONTROLLER_PORT=$(free_port)
    while [[ $CONTROLLER_PORT == "$PORT" ]]; do CONTROLLER_PORT=$(free_port); done
    # KRaft combined mode, one node, loopback only. Replication factors of 1
    # for the internal topics; no log.flush.* settings: Kafka's defaults leave
    # flushing to the OS (no fsync per message), as Strand's default config.
    cat >"$WORK/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://$BOOTSTRAP,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$BOOTSTRAP
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$WORK/data
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.segment.bytes=1073741824
message.max.bytes=1048588
socket.request.max.bytes=104857600
EOF
    KAFKA_CP="$KAFKA_LIB/*"
    KAFKA_JAVA=(java "-Xms$KAFKA_HEAP" "-Xmx$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true
        -Dorg.slf4j.simpleLogger.defaultLogLevel=info -cp "$KAFKA_CP")
    CLUSTER_ID=$("${KAFKA_JAVA[@]}" kafka.tools.StorageTool random-uuid 2>>"$WORK/broker.log")
    "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$CLUSTER_ID" \
        -c "$WORK/server.properties" >>"$WORK/broker.log" 2>&1 ||
        { echo "kafka storage format failed:" >&2; cat "$WORK/broker.log" >&2; exit 1; }
    "${KAFKA_JAVA[@]}" kafka.Kafka "$WORK/server.properties" >>"$WORK/broker.log" 2>&1 &
    BROKER_PID=$!
    WAIT_STEPS=600 # x 0.1 s: the JVM and KRaft need a few seconds
fi
for _ in $(seq "$WAIT_STEPS"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
    kill -0 "$BROKER_PID" 2>/dev/null || { echo "broker exited:" >&2; cat "$WORK/broker.log" >&2; exit 1; }
    sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null ||
    { echo "broker did not accept on $BOOTSTRAP in time:" >&2; tail -n 40 "$WORK/broker.log" >&2; exit 1; }
echo "$BROKER broker pid $BROKER_PID on $BOOTSTRAP, data in $WORK/data; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

LOADGEN=target/release/strand-loadgen
COMMON=(--bootstrap "$BOOTSTRAP" --records "$RECORDS" --record-size "$RECORD_SIZE" --acks all
    --compression none --linger-ms "$LINGER_MS" --batch-size "$BATCH_SIZE" --queue-kbytes "$QUEUE_KBYTES"
    --max-in-flight "$MAX_IN_FLIGHT" --warmup --mode produce)
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
echo "# broker: $BROKER$([[ $BROKER == kafka ]] && echo " (Apache Kafka 4.1.2, KRaft combined, -Xmx$KAFKA_HEAP, $(java -version 2>&1 | head -n 1))")"
echo "# $RECORDS records x $RECORD_SIZE B, acks=all, linger.ms=$LINGER_MS, batch.size=$BATCH_SIZE," \
    "queue.buffering.max.kbytes=$QUEUE_KBYTES, max.in.flight=$MAX_IN_FLIGHT, commit every $COMMIT_MS ms; $ROUNDS rounds; medians"
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
