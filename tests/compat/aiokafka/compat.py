#!/usr/bin/env python3
"""Strand compatibility program for aiokafka.

Usage: compat.py HOST:PORT

A small real asyncio application of the client: AIOKafkaAdminClient create,
keyed produce with headers (acks=all), group consume + commit, committed
offsets read back (consumer and admin), idempotent produce, transactions with
a read_committed consume and consume-transform-produce with offsets sent to
the transaction. api_version="auto". One RESULT line per capability; exits 1
if any capability failed.
"""
import asyncio
import logging
import os
import sys
import time
import uuid

import aiokafka
import aiokafka.errors as Errors
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import apiversions  # noqa: E402  (tests/compat/apiversions.py)

CLIENT = "aiokafka"
VERSION = aiokafka.__version__
PARTITIONS = 3
RECORDS = 30
TIMEOUT = 30

results = []
seen = set()
# From the ApiVersions data aiokafka negotiated: without InitProducerId (key 22)
# the idempotent producer cannot work, a named gap. (Transactions: txn_failure.)
LACKS_INIT_PRODUCER_ID = [False]


class LastClientError(logging.Handler):
    """Keeps aiokafka's last logged error, to name the cause in a fail line."""
    last = None

    def emit(self, record):
        if record.levelno >= logging.ERROR:
            LastClientError.last = record.getMessage()


logging.basicConfig(level=logging.ERROR)
logging.getLogger("aiokafka").addHandler(LastClientError())


def result(cap, status, detail):
    if status == "fail" and LastClientError.last:
        detail = "%s; last aiokafka error: %s" % (detail, LastClientError.last)
    detail = " ".join(str(detail).split())[:300]
    results.append(status)
    seen.add(cap)
    print("RESULT client=%s version=%s capability=%s status=%s detail=%s"
          % (CLIENT, VERSION, cap, status, detail), flush=True)


def describe(e):
    return "%s: %s" % (type(e).__name__, e)


def is_unsupported(e):
    return LACKS_INIT_PRODUCER_ID[0] or isinstance(e, (Errors.UnsupportedVersionError, Errors.IncompatibleBrokerVersion,
                                                       Errors.UnsupportedForMessageFormatError))


# The broker's API keys, from the ApiVersions data aiokafka negotiated (or, if it
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


async def consume(consumer, n, prefix, timeout=TIMEOUT):
    out = []
    deadline = time.time() + timeout
    while len(out) < n and time.time() < deadline:
        batches = await consumer.getmany(timeout_ms=500)
        for _tp, msgs in batches.items():
            out.extend(m for m in msgs if m.value.startswith(prefix))
    return out


async def end_offsets(bootstrap, topic):
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await c.start()
    try:
        ends = await asyncio.wait_for(c.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)]), 20)
    finally:
        await c.stop()
    return {tp.partition: o for tp, o in ends.items()}


async def main():
    bootstrap = sys.argv[1]
    run = uuid.uuid4().hex[:10]
    topic = "compat-aio-%s" % run
    group = "compat-aio-group-%s" % run

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        versions = {}
        for broker in admin._client.cluster.brokers():
            conn = await admin._client._get_conn(broker.nodeId)
            versions.update(getattr(conn, "_versions", {}) or {})
        LACKS_INIT_PRODUCER_ID[0] = bool(versions) and 22 not in versions
        if versions:
            BROKER_APIS[0] = set(versions)
        resp = await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        errs = [t for t in getattr(resp, "topic_errors", getattr(resp, "topics", [])) if t[1] != 0]
        md = await admin.describe_topics([topic])
        parts = md[0]["partitions"]
        if errs or len(parts) != PARTITIONS:
            result("admin", "fail", "create errors %s, %d partitions after create" % (errs, len(parts)))
        else:
            result("admin", "pass", "create_topics %d partitions, describe_topics agrees; api_version auto=%s"
                   % (PARTITIONS, getattr(admin._client, "api_version", "auto")))
    except Exception as e:  # noqa: BLE001
        result("admin", "fail", "AIOKafkaAdminClient: %s" % describe(e))
    if BROKER_APIS[0] is None:
        try:
            BROKER_APIS[0] = set(apiversions.api_versions(bootstrap))
        except Exception as e:  # noqa: BLE001
            print("ApiVersions probe failed: %s" % e, file=sys.stderr)

    records = expected_records("plain")
    produced = False
    try:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5)
        await p.start()
        try:
            futs = [await p.send(topic, key=k, value=v, headers=h) for k, v, h in records]
            await asyncio.wait_for(asyncio.gather(*futs), TIMEOUT)
        finally:
            await p.stop()
        produced = True
        result("produce", "pass", "%d keyed records with headers, acks=all" % RECORDS)
    except Exception as e:  # noqa: BLE001
        result("produce", "fail", "send: %s" % describe(e))

    if not produced:
        result("consume-group", "fail", "nothing produced")
        result("committed-offsets", "fail", "nothing produced")
    else:
        try:
            c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                 auto_offset_reset="earliest", enable_auto_commit=False)
            await c.start()
            try:
                got = await consume(c, RECORDS, b"plain-")
                err = check_records(got, records)
                if not err:
                    await c.commit()
                committed = {p: await c.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
            finally:
                await c.stop()
            if err:
                result("consume-group", "fail", err)
                result("committed-offsets", "fail", "not reached: consume failed")
            else:
                result("consume-group", "pass", "subscribe, %d records checked, commit" % RECORDS)
                ends = await end_offsets(bootstrap, topic)
                via_admin = {tp.partition: om.offset for tp, om in
                             (await admin.list_consumer_group_offsets(group)).items() if tp.topic == topic}
                if committed != ends:
                    result("committed-offsets", "fail", "consumer.committed %s != end offsets %s" % (committed, ends))
                elif via_admin != ends:
                    result("committed-offsets", "fail", "admin list_consumer_group_offsets %s != end offsets %s" % (via_admin, ends))
                else:
                    result("committed-offsets", "pass", "committed() and admin OffsetFetch return end offsets %s" % ends)
        except Exception as e:  # noqa: BLE001
            if "consume-group" not in seen:
                result("consume-group", "fail", "consume/commit: %s" % describe(e))
            result("committed-offsets", "fail", "%s (ListOffsets for the end offsets)" % describe(e)
                   if "offsets by times" in str(e) or isinstance(e, asyncio.TimeoutError) else describe(e))

    # idempotent
    try:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await p.start()
        recs = expected_records("idem")
        try:
            futs = [await p.send(topic, key=k, value=v, headers=h) for k, v, h in recs]
            await asyncio.wait_for(asyncio.gather(*futs), TIMEOUT)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await c.start()
        try:
            got = await consume(c, RECORDS, b"idem-")
        finally:
            await c.stop()
        err = check_records(got, recs)
        result("idempotent", "fail" if err else "pass", err or "enable_idempotence=True, %d records checked" % RECORDS)
    except Exception as e:  # noqa: BLE001
        if is_unsupported(e):
            result("idempotent", "gap", "broker lacks InitProducerId (idempotent producer): %s" % describe(e))
        else:
            result("idempotent", "fail", "idempotent produce: %s" % describe(e))

    # transactions
    try:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="compat-aio-tx-%s" % run)
        await asyncio.wait_for(p.start(), TIMEOUT)
        aborted, txn = expected_records("aborted"), expected_records("txn")
        try:
            await p.begin_transaction()
            for k, v, h in aborted:
                await p.send(topic, key=k, value=v, headers=h)
            await p.abort_transaction()
            async with p.transaction():
                for k, v, h in txn:
                    await p.send(topic, key=k, value=v, headers=h)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             isolation_level="read_committed")
        await c.start()
        try:
            got = await consume(c, 10 ** 6, b"", timeout=8)
        finally:
            await c.stop()
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
        await admin.create_topics([NewTopic(out_topic, PARTITIONS, 1)])
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="compat-aio-ctp-%s" % run)
        await asyncio.wait_for(p.start(), TIMEOUT)
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=ctp_group, auto_offset_reset="earliest",
                             enable_auto_commit=False, isolation_level="read_committed")
        await c.start()
        try:
            got = await consume(c, RECORDS, b"plain-")
            async with p.transaction():
                for m in got:
                    # a consumed record's headers are a tuple; aiokafka's send
                    # wants a list (its C record builder rejects a tuple)
                    await p.send(out_topic, key=m.key, value=m.value.upper(), headers=list(m.headers))
                offsets = {tp: await c.position(tp) for tp in c.assignment()}
                await p.send_offsets_to_transaction(offsets, ctp_group)
            committed = {tp.partition: await c.committed(tp) for tp in c.assignment()}
        finally:
            await c.stop()
            await p.stop()
        c2 = AIOKafkaConsumer(out_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                              isolation_level="read_committed")
        await c2.start()
        try:
            out = await consume(c2, RECORDS, b"PLAIN-")
        finally:
            await c2.stop()
        err = check_records(out, [(k, v.upper(), h) for k, v, h in records])
        ends = await end_offsets(bootstrap, topic)
        sent = {tp.partition: o for tp, o in offsets.items()}
        last = {}
        for m in got:
            last[m.partition] = max(last.get(m.partition, -1), m.offset)
        if not err and committed != sent:
            err = "offsets committed with the transaction %s != offsets sent to it %s" % (committed, sent)
        # the consumer's positions were sent: past every transformed record,
        # never beyond the log end (a position may stop before a trailing
        # transaction marker or run up to the log end past it)
        if not err and any(not (last[q] < sent.get(q, -1) <= ends[q]) for q in last):
            err = "offsets sent %s not past the last transformed offsets %s or beyond end offsets %s" % (sent, last, ends)
        if not err:
            # a new member of the group resumes at the committed offsets and
            # reads none of the transformed records again
            c3 = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=ctp_group, auto_offset_reset="earliest",
                                  enable_auto_commit=False, isolation_level="read_committed")
            await c3.start()
            try:
                again = await consume(c3, 1 << 30, b"", timeout=8)
            finally:
                await c3.stop()
            reread = [m for m in again if m.offset < sent[m.partition]]
            if reread:
                err = "resumed member re-read %d records below the committed offsets %s" % (len(reread), sent)
        result("consume-transform-produce", "fail" if err else "pass",
               err or "%d records transformed in one transaction; committed offsets %s = consumer positions sent to it "
               "(end offsets %s); a resumed member reads nothing again" % (RECORDS, sent, ends))
    except Exception as e:  # noqa: BLE001
        txn_failure("consume-transform-produce", apiversions.CONSUME_TRANSFORM_PRODUCE, "consume-transform-produce", e)

    await admin.close()
    return 1 if "fail" in results else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
