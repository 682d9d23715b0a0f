#!/usr/bin/env bash
# Java client (kafka-clients) and Kafka's command-line tools against a broker.
#
#   tests/compat/java/run.sh HOST:PORT
#
# Builds the Maven project in this directory (kafka-clients and kafka-tools,
# version pinned in pom.xml), then prints one line per capability:
#   RESULT client=<java|kafka-cli> version=... capability=... status=pass|fail|gap detail=...
# Exits non-zero if any line is a fail (a gap is not a failure).
set -uo pipefail

# With --cluster, the target is a three-broker cluster: the client checks
# report as java-cluster and the cluster tools (kafka-metadata-quorum,
# kafka-topics --describe, kafka-cluster, kafka-features) as kafka-cli-cluster.
CLUSTER=0
if [ "${1:-}" = "--cluster" ]; then
    CLUSTER=1
    shift
fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--cluster] HOST:PORT" >&2
    exit 2
fi
BOOTSTRAP=$1
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"

KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' pom.xml)
CLIENT_CAPS="admin produce consume-group committed-offsets idempotent transactions consume-transform-produce"
CLI_CAPS="topics console-produce-consume consumer-groups transactions-cli"
CLIENT_NAME=java
CLI_NAME=kafka-cli
MODE_PREFIX=
if [ $CLUSTER = 1 ]; then
    CLI_CAPS="metadata-quorum topics-leaders replica-assignment leader-election reassign-partitions cluster-id features"
    CLIENT_NAME=java-cluster
    CLI_NAME=kafka-cli-cluster
    MODE_PREFIX=cluster-
fi

# Prints a fail line for every capability of $1 not already in file $2.
fail_missing() {
    local client=$1 out=$2 caps=$3 why=$4 cap
    for cap in $caps; do
        if ! grep -q "^RESULT client=$client .* capability=$cap " "$out" 2>/dev/null; then
            echo "RESULT client=$client version=$KAFKA_VERSION capability=$cap status=fail detail=$why"
        fi
    done
}

install_tools() {
    # Debian/Ubuntu CI images: install a JDK 17 and Maven when missing.
    if command -v java >/dev/null && command -v mvn >/dev/null; then return 0; fi
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "installing openjdk-17-jdk-headless and maven" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jdk-headless maven >&2 ||
            { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jdk-headless maven >&2; }
    fi
    command -v java >/dev/null && command -v mvn >/dev/null
}

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

if ! install_tools; then
    fail_missing $CLIENT_NAME "$OUT" "$CLIENT_CAPS" "java or mvn not available"
    fail_missing $CLI_NAME "$OUT" "$CLI_CAPS" "java or mvn not available"
    exit 1
fi

echo "building (mvn package, kafka $KAFKA_VERSION)" >&2
if ! mvn -q -B package >&2; then
    fail_missing $CLIENT_NAME "$OUT" "$CLIENT_CAPS" "maven build failed"
    fail_missing $CLI_NAME "$OUT" "$CLI_CAPS" "maven build failed"
    exit 1
fi

JAVA_OPTS=(-Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.logFile=System.err)
CP="$HERE/target/classes:$HERE/target/lib/*"
status=0
for mode in client cli; do
    if [ $mode = client ]; then name=$CLIENT_NAME; caps=$CLIENT_CAPS; else name=$CLI_NAME; caps=$CLI_CAPS; fi
    : >"$OUT"
    timeout 600 java "${JAVA_OPTS[@]}" -cp "$CP" strand.compat.Main "$MODE_PREFIX$mode" "$BOOTSTRAP" | tee "$OUT"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then status=1; fi
    # A crash or timeout must not drop capabilities from the table.
    fail_missing $name "$OUT" "$caps" "the $name program exited $rc before reporting this capability"
    if grep -q ' status=fail ' "$OUT"; then status=1; fi
done
exit $status
