#!/usr/bin/env bash
# Strand compatibility program for kcat (Debian package, librdkafka inside).
#
# Usage: run.sh HOST:PORT
#
# kcat has no admin API: the topic is auto-created (auto.create.topics.enable)
# by the producer's Metadata request, then checked with `kcat -L`. kcat has no
# way to send consumer offsets to a transaction, so consume-transform-produce
# is a client gap. One RESULT line per capability; exit 1 if any failed.
set -euo pipefail

bootstrap="$1"
version="$(kcat -V 2>&1 | sed -n 's/^Version \([^ ]*\).*librdkafka \([^ ]*\) .*/\1\/librdkafka-\2/p')"
run="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' | head -c 10)"
topic="compat-kcat-${run}"
group="compat-kcat-group-${run}"
records=30
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0

result() { # capability status detail
    local detail="${3//$'\n'/ }"
    printf 'RESULT client=kcat version=%s capability=%s status=%s detail=%s\n' "$version" "$1" "$2" "${detail:0:300}"
    [[ "$2" != fail ]] || failed=1
}

# kcat exits 0 on some broker errors; its stderr is checked too.
k() { timeout 60 kcat -b "$bootstrap" -q "$@"; }

# Input: key:value lines; values carry the sequence number so order can be checked.
gen() { # tag
    for ((i = 0; i < records; i++)); do printf 'key-%d:%s-value-%d\n' $((i % 10)) "$1" "$i"; done
}
# Output format: partition|offset|key|value|headers
fmt='%p|%o|%k|%s|%h\n'
# check FILE TAG: count, keys, values, headers, per-partition order
check() {
    local file="$1" tag="$2"
    awk -F'|' -v tag="$tag" -v n="$records" -v run="$run" '
        $4 ~ "^" tag "-value-" {
            seq = substr($4, length(tag "-value-") + 1) + 0
            if (seq in seen) { print "duplicate " $4; bad = 1; exit }
            seen[seq] = 1; count++
            if ($3 != "key-" (seq % 10)) { print "key " $3 " for " $4; bad = 1; exit }
            if ($5 != "client=kcat,run=" run) { print "headers " $5 " for " $4; bad = 1; exit }
            if (($1 in last) && (seq <= lastseq[$1] || $2 <= last[$1])) { print "partition " $1 " out of order at offset " $2; bad = 1; exit }
            last[$1] = $2; lastseq[$1] = seq
        }
        END { if (!bad && count != n) print "expected " n " records, got " count+0 }' "$file"
}

# produce (auto-creates the topic)
if gen plain | k -P -t "$topic" -K: -H client=kcat -H "run=${run}" -X acks=all \
        -X enable.idempotence=false 2>"$tmp/produce.err" && ! grep -qi error "$tmp/produce.err"; then
    produced=1
else
    produced=0
fi

# admin: no admin API in kcat; auto-creation checked through Metadata
if k -L -t "$topic" >"$tmp/meta" 2>&1 && grep -q "topic \"$topic\" with [0-9]* partitions" "$tmp/meta"; then
    result admin gap "client has no admin API; topic auto-created by the producer's Metadata request, kcat -L shows it with $(sed -n "s/.*topic \"$topic\" with \([0-9]*\) partitions.*/\1/p" "$tmp/meta") partitions"
else
    result admin fail "auto-created topic not in Metadata: $(tr '\n' ' ' <"$tmp/meta")"
fi

if [[ $produced == 1 ]]; then
    result produce pass "${records} keyed records with headers, acks=all"
else
    result produce fail "kcat -P: $(tr '\n' ' ' <"$tmp/produce.err")"
fi

# consume-group: balanced consumer (-G), offsets auto-committed and committed on close
consume_group() { # group topic outfile [extra args]
    local g="$1" t="$2" out="$3"
    shift 3
    local rc=0
    timeout 30 kcat -b "$bootstrap" -G "$g" -e -f "$fmt" -X auto.offset.reset=earliest -X auto.commit.interval.ms=100 \
        -X session.timeout.ms=10000 "$@" "$t" >"$out" 2>"$out.err" || rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "kcat -G exit ${rc}$([[ $rc == 124 ]] && echo ' (no end of partitions within 30 s)'); $(grep -m1 'ERROR' "$out.err")" >"$out.why"
        return 1
    fi
}
if consume_group "$group" "$topic" "$tmp/c1" && err="$(check "$tmp/c1" plain)" && [[ -z "$err" ]]; then
    result consume-group pass "kcat -G subscribe, ${records} records checked, offsets committed on close"
    consumed=1
else
    result consume-group fail "${err:-$(cat "$tmp/c1.why" 2>/dev/null)}"
    consumed=0
fi

# committed-offsets: kcat cannot print them; a second consumer of the group
# must resume at the committed offsets (sees only the one new record).
if [[ $consumed == 1 ]]; then
    echo "key-0:after-commit" | k -P -t "$topic" -K: -X acks=all 2>/dev/null
    if consume_group "$group" "$topic" "$tmp/c2" && [[ "$(wc -l <"$tmp/c2")" == 1 ]] && grep -q '|after-commit|' "$tmp/c2"; then
        result committed-offsets pass "same group resumes at the committed offset (reads only the 1 new record)"
    else
        result committed-offsets fail "same group after commit read $(wc -l <"$tmp/c2") records, expected 1 new: $(head -c 200 "$tmp/c2" | tr '\n' ' ')"
    fi
else
    result committed-offsets fail "not reached: consume-group failed"
fi

# idempotent
unsupported='not supported by any of the|UNSUPPORTED_FEATURE|UNSUPPORTED_VERSION'
idem_topic="${topic}-idem"
if gen plain | k -P -t "$idem_topic" -K: -H client=kcat -H "run=${run}" -X enable.idempotence=true \
        2>"$tmp/idem.err" && ! grep -qiE 'error|fatal' "$tmp/idem.err"; then
    if k -C -t "$idem_topic" -e -f "$fmt" >"$tmp/idem" 2>/dev/null && err="$(check "$tmp/idem" plain)" && [[ -z "$err" ]]; then
        result idempotent pass "enable.idempotence=true, ${records} records checked"
    else
        result idempotent fail "${err:-reading back failed}"
    fi
elif grep -qE "$unsupported" "$tmp/idem.err"; then
    result idempotent gap "broker lacks InitProducerId (idempotent producer): $(grep -m1 -E "$unsupported" "$tmp/idem.err")"
else
    result idempotent fail "idempotent produce: $(tr '\n' ' ' <"$tmp/idem.err")"
fi

# Transaction APIs the broker does not advertise (kcat cannot show ApiVersions:
# one raw ApiVersions request through tests/compat/apiversions.py). A failed
# transactional path is a gap exactly when this is not empty.
compat="$(cd "$(dirname "$0")/.." && pwd)"
py="$compat/.venv/bin/python"
[[ -x "$py" ]] || py=python3
missing_apis() { # KEY... -> "Name(key), ..." on stdout; exit 2 when unknown
    local out
    out="$("$py" "$compat/apiversions.py" "$bootstrap" "$@" 2>"$tmp/apiversions.err")" || return 2
    printf '%s' "$out" | paste -sd, - | sed 's/,/, /g'
}

# transactions: kcat -P with transactional.id sends all input in one transaction
tx_topic="${topic}-tx"
if gen txn | k -P -t "$tx_topic" -K: -H client=kcat -H "run=${run}" -X "transactional.id=compat-kcat-${run}" \
        2>"$tmp/tx.err" && ! grep -qiE 'error|fatal' "$tmp/tx.err"; then
    if k -C -t "$tx_topic" -e -f "$fmt" -X isolation.level=read_committed >"$tmp/tx" 2>/dev/null &&
        err="$(check "$tmp/tx" txn)" && [[ -z "$err" ]]; then
        result transactions pass "transactional.id produce committed, read_committed consume sees ${records} records"
    else
        result transactions fail "${err:-read_committed consume failed}"
    fi
elif ! lacking="$(missing_apis 24 26)"; then
    result transactions fail "transactional produce: $(tr '\n' ' ' <"$tmp/tx.err") (broker ApiVersions unknown: $(cat "$tmp/apiversions.err"))"
elif [[ -n "$lacking" ]]; then
    result transactions gap "broker lacks ${lacking} (transactions, not in ApiVersions): transactional produce: $(grep -m1 -iE 'error|fatal' "$tmp/tx.err" || head -n1 "$tmp/tx.err")"
else
    result transactions fail "transactional produce: $(tr '\n' ' ' <"$tmp/tx.err")"
fi

result consume-transform-produce gap "client has no consume-transform-produce (no way to send consumer offsets to a transaction)"

exit "$failed"
