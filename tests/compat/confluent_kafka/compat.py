#!/usr/bin/env python3
"""Strand compatibility program for confluent-kafka (librdkafka).

Usage: compat.py HOST:PORT

A small real application of the client: admin create, keyed produce with
headers (acks=all), group consume + commit, committed offsets read back,
idempotent produce, transactions (read_committed) and consume-transform-produce
with offsets sent to the transaction. One RESULT line per capability; exits 1
if any capability failed.
"""
import os
import sys
import time
import uuid

import confluent_kafka
from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import apiversions  # noqa: E402  (tests/compat/apiversions.py)

# STRAND_COMPAT_CLUSTER=1: the target is a three-broker cluster (reported as confluent-kafka-cluster).
CLIENT = "confluent-kafka-cluster" if os.environ.get("STRAND_COMPAT_CLUSTER") == "1" else "confluent-kafka"
VERSION = "%s/librdkafka-%s" % (confluent_kafka.__version__, confluent_kafka.libversion()[0])
PARTITIONS = 3
RECORDS = 30
TIMEOUT = 30.0

results = []


def result(cap, status, detail):
    detail = " ".join(str(detail).split())[:300]
    results.append(status)
    print("RESULT client=%s version=%s capability=%s status=%s detail=%s"
          % (CLIENT, VERSION, cap, status, detail), flush=True)


class Gap(Exception):
    pass


# Errors with which librdkafka says the broker lacks an API.
UNSUPPORTED = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION,
               KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT}


def is_unsupported(err):
    if isinstance(err, KafkaException):
        err = err.args[0]
    if isinstance(err, KafkaError):
        if err.code() in UNSUPPORTED:
            return True
        return "not supported by broker" in err.str().lower()
    return False


# The broker's ApiVersions (librdkafka keeps its own private), asked once with
# tests/compat/apiversions.py: None when it could not be asked.
BROKER_APIS = [None]


def txn_failure(cap, needed, what, e):
    """A transactional path failed: a gap exactly when the broker does not
    advertise an API the capability needs, otherwise a real failure."""
    if BROKER_APIS[0] is None:
        result(cap, "fail", "%s: %s (broker ApiVersions unknown)" % (what, e))
        return
    lacking = apiversions.missing(BROKER_APIS[0], needed)
    if lacking:
        result(cap, "gap", "broker lacks %s (transactions, not in ApiVersions): %s: %s" % (", ".join(lacking), what, e))
    else:
        result(cap, "fail", "%s: %s" % (what, e))


def expected_records(tag):
    return [(("key-%d" % (i % 10)).encode(), ("%s-value-%d" % (tag, i)).encode(),
             [("seq", str(i).encode()), ("client", CLIENT.encode())]) for i in range(RECORDS)]


def produce(producer, topic, records):
    delivered, errors = [], []

    def cb(err, msg):
        (errors if err else delivered).append(err or msg)

    for k, v, h in records:
        producer.produce(topic, key=k, value=v, headers=h, on_delivery=cb)
        producer.poll(0)
    left = producer.flush(TIMEOUT)
    if errors:
        raise errors[0] if isinstance(errors[0], KafkaException) else KafkaException(errors[0])
    if left or len(delivered) != len(records):
        raise RuntimeError("%d of %d records delivered" % (len(delivered), len(records)))
    return delivered


def consume(consumer, n, timeout=TIMEOUT):
    out = []
    deadline = time.time() + timeout
    while len(out) < n and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(m.error())
        out.append(m)
    return out


def check_records(got, records):
    """count, keys, values, headers and per-partition order."""
    if len(got) != len(records):
        return "expected %d records, got %d" % (len(records), len(got))
    want = {v: (k, h) for k, v, h in records}
    order = {v: i for i, (_, v, _) in enumerate(records)}
    last = {}
    for m in got:
        v = m.value()
        if v not in want:
            return "unexpected value %r" % v
        k, h = want.pop(v)
        if m.key() != k:
            return "key %r != %r for %r" % (m.key(), k, v)
        if list(m.headers() or []) != h:
            return "headers %r != %r for %r" % (m.headers(), h, v)
        p = m.partition()
        if p in last and not (order[v] > last[p][0] and m.offset() > last[p][1]):
            return "partition %d out of order at offset %d" % (p, m.offset())
        last[p] = (order[v], m.offset())
    if want:
        return "missing %d records" % len(want)
    return None


def consumer(bootstrap, group, **extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": 10000}
    conf.update(extra)
    return Consumer(conf)


def main():
    bootstrap = sys.argv[1]
    run = uuid.uuid4().hex[:10]
    topic = "compat-ck-%s" % run
    group = "compat-ck-group-%s" % run
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        BROKER_APIS[0] = apiversions.api_versions(bootstrap)
    except Exception as e:  # noqa: BLE001
        print("ApiVersions probe failed: %s" % e, file=sys.stderr)

    # admin
    admin_ok = False
    try:
        fs = admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=10)
        fs[topic].result(TIMEOUT)
        md = admin.list_topics(topic, timeout=TIMEOUT)
        parts = md.topics[topic].partitions
        if md.topics[topic].error is not None or len(parts) != PARTITIONS:
            result("admin", "fail", "metadata after create: %d partitions, error %s" % (len(parts), md.topics[topic].error))
        else:
            admin_ok = True
            result("admin", "pass", "CreateTopics %s with %d partitions, Metadata agrees" % (topic, PARTITIONS))
    except Exception as e:  # noqa: BLE001
        result("admin", "fail", "CreateTopics/Metadata: %s" % e)
    if not admin_ok:
        topic = topic + "-auto"  # fall back to auto-creation so the rest still runs

    # produce
    records = expected_records("plain")
    produced = False
    try:
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                      "linger.ms": 5})
        produce(p, topic, records)
        produced = True
        result("produce", "pass", "%d keyed records with headers, acks=all" % RECORDS)
    except Exception as e:  # noqa: BLE001
        result("produce", "fail", "produce: %s" % e)

    # consume-group + committed-offsets
    if not produced:
        result("consume-group", "fail", "nothing produced")
        result("committed-offsets", "fail", "nothing produced")
    else:
        try:
            c = consumer(bootstrap, group)
            c.subscribe([topic])
            got = consume(c, RECORDS)
            err = check_records(got, records)
            if err:
                result("consume-group", "fail", err)
            else:
                c.commit(asynchronous=False)
                result("consume-group", "pass", "subscribe, %d records checked, commit" % RECORDS)
            # committed offsets must equal each partition's end offset
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            committed = c.committed(tps, timeout=TIMEOUT)
            c.close()
            bad = []
            for tp in committed:
                lo, hi = c_watermarks(bootstrap, topic, tp.partition)
                if tp.error or tp.offset != hi:
                    bad.append("p%d committed %s end %d" % (tp.partition, tp.offset, hi))
            # read back through a fresh consumer of the same group, and the admin API
            c2 = consumer(bootstrap, group)
            again = c2.committed(tps, timeout=TIMEOUT)
            c2.close()
            if [t.offset for t in again] != [t.offset for t in committed]:
                bad.append("second consumer sees %s" % [t.offset for t in again])
            if err:
                result("committed-offsets", "fail", "not committed: consume failed")
            elif bad:
                result("committed-offsets", "fail", "; ".join(bad))
            else:
                result("committed-offsets", "pass", "OffsetFetch returns end offsets %s" % [t.offset for t in committed])
        except Exception as e:  # noqa: BLE001
            result("consume-group", "fail", "consume/commit: %s" % e)
            result("committed-offsets", "fail", "not reached: %s" % e)

    # idempotent
    try:
        idem_topic = topic
        errors = []
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                      "error_cb": lambda e: errors.append(e)})
        recs = expected_records("idem")
        try:
            produce(p, idem_topic, recs)
        except KafkaException as e:
            fatal = [e for e in errors if e.fatal()] or [e]
            raise fatal[0] if isinstance(fatal[0], KafkaException) else KafkaException(fatal[0])
        c = consumer(bootstrap, group + "-idem")
        c.subscribe([idem_topic])
        got = [m for m in consume(c, 2 * RECORDS) if m.value().startswith(b"idem-")]
        c.close()
        err = check_records(got, recs)
        result("idempotent", "fail" if err else "pass", err or "enable.idempotence=true, %d records checked" % RECORDS)
    except Exception as e:  # noqa: BLE001
        if is_unsupported(e) or any(is_unsupported(x) for x in errors):
            result("idempotent", "gap", "broker lacks InitProducerId (idempotent producer): %s" % e)
        else:
            result("idempotent", "fail", "idempotent produce: %s" % e)

    # transactions
    try:
        tx_topic = topic
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compat-ck-tx-%s" % run})
        p.init_transactions(TIMEOUT)
        aborted = expected_records("aborted")
        committed_recs = expected_records("txn")
        p.begin_transaction()
        for k, v, h in aborted:
            p.produce(tx_topic, key=k, value=v, headers=h)
        p.flush(TIMEOUT)
        p.abort_transaction(TIMEOUT)
        p.begin_transaction()
        for k, v, h in committed_recs:
            p.produce(tx_topic, key=k, value=v, headers=h)
        p.commit_transaction(TIMEOUT)
        c = consumer(bootstrap, group + "-rc", **{"isolation.level": "read_committed"})
        c.subscribe([tx_topic])
        got = consume(c, 10 ** 6, timeout=10)
        c.close()
        if any(m.value().startswith(b"aborted-") for m in got):
            result("transactions", "fail", "read_committed consumer saw aborted records")
        else:
            err = check_records([m for m in got if m.value().startswith(b"txn-")], committed_recs)
            result("transactions", "fail" if err else "pass",
                   err or "abort + commit, read_committed sees only the %d committed records" % RECORDS)
    except Exception as e:  # noqa: BLE001
        txn_failure("transactions", apiversions.TRANSACTIONS, "transactional produce", e)

    # consume-transform-produce
    try:
        out_topic = topic + "-out"
        ctp_group = group + "-ctp"
        if admin_ok:
            admin.create_topics([NewTopic(out_topic, PARTITIONS, 1)])[out_topic].result(TIMEOUT)
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compat-ck-ctp-%s" % run})
        p.init_transactions(TIMEOUT)
        c = consumer(bootstrap, ctp_group, **{"isolation.level": "read_committed"})
        c.subscribe([topic])
        got = [m for m in consume(c, 10 ** 6, timeout=10) if m.value().startswith(b"plain-")]
        p.begin_transaction()
        for m in got:
            p.produce(out_topic, key=m.key(), value=m.value().upper(), headers=m.headers())
        positions = c.position(c.assignment())
        p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), TIMEOUT)
        p.commit_transaction(TIMEOUT)
        committed = c.committed([TopicPartition(topic, i) for i in range(PARTITIONS)], timeout=TIMEOUT)
        c.close()
        c2 = consumer(bootstrap, ctp_group + "-check", **{"isolation.level": "read_committed"})
        c2.subscribe([out_topic])
        out = consume(c2, RECORDS)
        c2.close()
        want = [(k, v.upper(), h) for k, v, h in records]
        err = check_records(out, want)
        ends = [c_watermarks(bootstrap, topic, i)[1] for i in range(PARTITIONS)]
        if not err and [t.offset for t in committed] != ends:
            err = "offsets sent to the transaction %s != end offsets %s" % ([t.offset for t in committed], ends)
        result("consume-transform-produce", "fail" if err else "pass",
               err or "%d records transformed in one transaction, offsets committed with it" % RECORDS)
    except Exception as e:  # noqa: BLE001
        txn_failure("consume-transform-produce", apiversions.CONSUME_TRANSFORM_PRODUCE, "consume-transform-produce", e)

    return 1 if "fail" in results else 0


_wm_consumer = None


def c_watermarks(bootstrap, topic, partition):
    global _wm_consumer
    if _wm_consumer is None:
        _wm_consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-ck-wm"})
    return _wm_consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT)


if __name__ == "__main__":
    sys.exit(main())
