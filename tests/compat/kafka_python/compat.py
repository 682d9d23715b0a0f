#!/usr/bin/env python3
"""Strand compatibility program for kafka-python.

Usage: compat.py HOST:PORT

A small real application of the client: KafkaAdminClient create, keyed
produce with headers (acks=all), group consume + commit, committed offsets
read back (consumer and admin), idempotent produce, transactions with a
read_committed consume and consume-transform-produce with offsets sent to the
transaction. api_version is left to auto-detection (ApiVersions). One RESULT
line per capability; exits 1 if any capability failed.
"""
import os
import sys
import time
import uuid

import kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata
import kafka.errors as Errors

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import apiversions  # noqa: E402  (tests/compat/apiversions.py)

CLIENT = "kafka-python"
VERSION = kafka.__version__
PARTITIONS = 3
RECORDS = 30
TIMEOUT = 30

results = []
seen = set()


def result(cap, status, detail):
    detail = " ".join(str(detail).split())[:300]
    results.append(status)
    seen.add(cap)
    print("RESULT client=%s version=%s capability=%s status=%s detail=%s"
          % (CLIENT, VERSION, cap, status, detail), flush=True)


def describe(e):
    return "%s: %s" % (type(e).__name__, e)


# Set from the ApiVersions data kafka-python negotiated: when the broker does not
# list InitProducerId (key 22), the idempotent producer cannot work, and its
# failure is a named gap. (Transactions: see txn_failure.)
LACKS_INIT_PRODUCER_ID = [False]


def is_unsupported(e):
    """kafka-python's way of saying the broker lacks an API."""
    return LACKS_INIT_PRODUCER_ID[0] or isinstance(e, (Errors.UnsupportedVersionError, Errors.IncompatibleBrokerVersion,
                          Errors.UnsupportedForMessageFormatError)) or "not supported" in str(e).lower()


# The broker's API keys, from the ApiVersions data kafka-python negotiated (or, if it
# has none, from tests/compat/apiversions.py); None when unknown.
BROKER_APIS = [None]


def txn_failure(cap, needed, what, e):
    """A transactional path failed: a gap exactly when the broker does not
    advertise an API the capability needs, otherwise a real failure."""
    if BROKER_APIS[0] is None:
        result(cap, "fail", "%s: %s (broker ApiVersions unknown)" % (what, describe(e)))
        return
    lacking = apiversions.missing(BROKER_APIS[0], needed)
    if lacking:
        result(cap, "gap", "broker lacks %s (transactions, not in ApiVersions): %s: %s"
               % (", ".join(lacking), what, describe(e)))
    else:
        result(cap, "fail", "%s: %s" % (what, describe(e)))


def expected_records(tag):
    return [(("key-%d" % (i % 10)).encode(), ("%s-value-%d" % (tag, i)).encode(),
             [("seq", str(i).encode()), ("client", CLIENT.encode())]) for i in range(RECORDS)]


def check_records(got, records):
    """count, keys, values, headers and per-partition order."""
    if len(got) != len(records):
        return "expected %d records, got %d" % (len(records), len(got))
    want = {v: (k, h) for k, v, h in records}
    order = {v: i for i, (_, v, _) in enumerate(records)}
    last = {}
    for m in got:
        v = m.value
        if v not in want:
            return "unexpected value %r" % v
        k, h = want.pop(v)
        if m.key != k:
            return "key %r != %r for %r" % (m.key, k, v)
        if [(a, bytes(b)) for a, b in (m.headers or [])] != h:
            return "headers %r != %r for %r" % (m.headers, h, v)
        p = m.partition
        if p in last and not (order[v] > last[p][0] and m.offset > last[p][1]):
            return "partition %d out of order at offset %d" % (p, m.offset)
        last[p] = (order[v], m.offset)
    return None


def consume(consumer, n, prefix, timeout=TIMEOUT):
    out = []
    deadline = time.time() + timeout
    while len(out) < n and time.time() < deadline:
        for _tp, msgs in consumer.poll(timeout_ms=500).items():
            out.extend(m for m in msgs if m.value.startswith(prefix))
    return out


def produce(producer, topic, records):
    futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in records]
    producer.flush(TIMEOUT)
    return [f.get(TIMEOUT) for f in futures]


def end_offsets(bootstrap, topic):
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    ends = c.end_offsets(tps)
    c.close()
    return {tp.partition: o for tp, o in ends.items()}


def main():
    bootstrap = sys.argv[1]
    run = uuid.uuid4().hex[:10]
    topic = "compat-kpy-%s" % run
    group = "compat-kpy-group-%s" % run

    # admin (api_version auto-detected from ApiVersions)
    admin = None
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        detected = admin._manager.broker_version
        versions = admin._manager.broker_version_data.api_versions or {}
        LACKS_INIT_PRODUCER_ID[0] = 22 not in versions  # InitProducerId
        if versions:
            BROKER_APIS[0] = set(versions)
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)], timeout_ms=TIMEOUT * 1000)
        parts = admin.describe_topics([topic])[0]["partitions"]
        if len(parts) != PARTITIONS:
            result("admin", "fail", "describe_topics after create: %d partitions" % len(parts))
        else:
            result("admin", "pass", "create_topics %d partitions, describe_topics agrees; auto-detected api_version=%s"
                   % (PARTITIONS, ".".join(map(str, detected))))
    except Exception as e:  # noqa: BLE001
        result("admin", "fail", "KafkaAdminClient: %s" % describe(e))

    if BROKER_APIS[0] is None:
        try:
            BROKER_APIS[0] = set(apiversions.api_versions(bootstrap))
        except Exception as e:  # noqa: BLE001
            print("ApiVersions probe failed: %s" % e, file=sys.stderr)

    # produce (idempotence off: tested on its own below)
    records = expected_records("plain")
    produced = False
    try:
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5)
        produce(p, topic, records)
        p.close()
        produced = True
        result("produce", "pass", "%d keyed records with headers, acks=all" % RECORDS)
    except Exception as e:  # noqa: BLE001
        result("produce", "fail", "send: %s" % describe(e))

    # consume-group + committed-offsets
    if not produced:
        result("consume-group", "fail", "nothing produced")
        result("committed-offsets", "fail", "nothing produced")
    else:
        try:
            c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                              enable_auto_commit=False)
            c.subscribe([topic])
            got = consume(c, RECORDS, b"plain-")
            err = check_records(got, records)
            if not err:
                c.commit()
            committed = {p: c.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
            c.close()
            if err:
                result("consume-group", "fail", err)
                result("committed-offsets", "fail", "not reached: consume failed")
            else:
                result("consume-group", "pass", "subscribe, %d records checked, commit" % RECORDS)
                ends = end_offsets(bootstrap, topic)
                via_admin = {tp.partition: om.offset for tp, om in
                             admin.list_group_offsets(group)[group].items() if tp.topic == topic}
                if committed != ends:
                    result("committed-offsets", "fail", "consumer.committed %s != end offsets %s" % (committed, ends))
                elif via_admin != ends:
                    result("committed-offsets", "fail", "admin list_consumer_group_offsets %s != end offsets %s" % (via_admin, ends))
                else:
                    result("committed-offsets", "pass", "committed() and admin OffsetFetch return end offsets %s" % ends)
        except Exception as e:  # noqa: BLE001
            if "consume-group" not in seen:
                result("consume-group", "fail", "consume/commit: %s" % describe(e))
            result("committed-offsets", "fail", "%s" % describe(e))

    # idempotent
    try:
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        recs = expected_records("idem")
        produce(p, topic, recs)
        p.close()
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        got = consume(c, RECORDS, b"idem-")
        c.close()
        err = check_records(got, recs)
        result("idempotent", "fail" if err else "pass", err or "enable_idempotence=True, %d records checked" % RECORDS)
    except Exception as e:  # noqa: BLE001
        if is_unsupported(e):
            result("idempotent", "gap", "broker lacks InitProducerId (idempotent producer): %s" % describe(e))
        else:
            result("idempotent", "fail", "idempotent produce: %s" % describe(e))

    # transactions
    try:
        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="compat-kpy-tx-%s" % run)
        p.init_transactions()
        aborted, txn = expected_records("aborted"), expected_records("txn")
        p.begin_transaction()
        for k, v, h in aborted:
            p.send(topic, key=k, value=v, headers=h)
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        for k, v, h in txn:
            p.send(topic, key=k, value=v, headers=h)
        p.commit_transaction()
        p.close()
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                          isolation_level="read_committed")
        got = consume(c, 10 ** 6, b"", timeout=8)
        c.close()
        if any(m.value.startswith(b"aborted-") for m in got):
            result("transactions", "fail", "read_committed consumer saw aborted records")
        else:
            err = check_records([m for m in got if m.value.startswith(b"txn-")], txn)
            result("transactions", "fail" if err else "pass",
                   err or "abort + commit, read_committed sees only the %d committed records" % RECORDS)
    except Exception as e:  # noqa: BLE001
        txn_failure("transactions", apiversions.TRANSACTIONS, "transactional produce", e)

    # consume-transform-produce
    try:
        out_topic = topic + "-out"
        ctp_group = group + "-ctp"
        admin.create_topics([NewTopic(out_topic, PARTITIONS, 1)], timeout_ms=TIMEOUT * 1000)
        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="compat-kpy-ctp-%s" % run)
        p.init_transactions()
        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=ctp_group, auto_offset_reset="earliest",
                          enable_auto_commit=False, isolation_level="read_committed")
        c.subscribe([topic])
        got = consume(c, RECORDS, b"plain-")
        p.begin_transaction()
        for m in got:
            p.send(out_topic, key=m.key, value=m.value.upper(), headers=m.headers)
        offsets = {tp: OffsetAndMetadata(c.position(tp), "", -1) for tp in c.assignment()}
        p.send_offsets_to_transaction(offsets, c.group_metadata())
        p.commit_transaction()
        p.close()
        committed = {tp.partition: c.committed(tp) for tp in c.assignment()}
        c.close()
        c2 = KafkaConsumer(out_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                           isolation_level="read_committed")
        out = consume(c2, RECORDS, b"PLAIN-")
        c2.close()
        err = check_records(out, [(k, v.upper(), h) for k, v, h in records])
        ends = end_offsets(bootstrap, topic)
        if not err and committed != ends:
            err = "offsets sent to the transaction %s != end offsets %s" % (committed, ends)
        result("consume-transform-produce", "fail" if err else "pass",
               err or "%d records transformed in one transaction, offsets committed with it" % RECORDS)
    except Exception as e:  # noqa: BLE001
        txn_failure("consume-transform-produce", apiversions.CONSUME_TRANSFORM_PRODUCE, "consume-transform-produce", e)

    if admin is not None:
        admin.close()
    return 1 if "fail" in results else 0


if __name__ == "__main__":
    sys.exit(main())
