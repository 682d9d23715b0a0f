#!/usr/bin/env node
// Strand compatibility program for kafkajs.
//
// Usage: node compat.js HOST:PORT
//
// A small real application of the client: admin createTopics, keyed produce
// with headers (acks=all), group consume + commitOffsets, committed offsets
// read back with admin.fetchOffsets, idempotent produce, transactions with a
// read_committed consume and consume-transform-produce with sendOffsets. One
// RESULT line per capability; exit 1 if any capability failed.
'use strict'

const crypto = require('crypto')
const net = require('net')
const { Kafka, logLevel } = require('kafkajs')
const VERSION = require('kafkajs/package.json').version

const PARTITIONS = 3
const RECORDS = 30
let failed = false
// kafkajs' last logged protocol error, to name the request behind a failure
let lastProtocolError = null
const logCreator = () => ({ log }) => {
  if (log.message && /^(\[Connection\] )?Response /.test(log.message) && log.error) lastProtocolError = `${log.message.replace('[Connection] ', '')}: ${log.error}`
  console.error(JSON.stringify(log))
}

function result (capability, status, detail) {
  if (status === 'fail') {
    failed = true
    if (lastProtocolError) detail = `${detail}; kafkajs logged: ${lastProtocolError}`
  }
  detail = String(detail).split(/\s+/).join(' ').slice(0, 300)
  console.log(`RESULT client=kafkajs version=${VERSION} capability=${capability} status=${status} detail=${detail}`)
}

const describe = (e) => `${e.name || 'Error'}: ${e.message}${e.type ? ` (${e.type})` : ''}`

// Which API keys does the broker advertise? kafkajs keeps its ApiVersions
// private, so ask with one ApiVersions v0 request. Without InitProducerId (22)
// the idempotent producer cannot work; without the transaction APIs a
// capability needs, transactions cannot: named gaps.
function brokerApiKeys (host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port })
    const clientId = Buffer.from('compat-probe')
    const body = Buffer.alloc(2 + 2 + 4 + 2 + clientId.length)
    body.writeInt16BE(18, 0) // ApiVersions
    body.writeInt16BE(0, 2)
    body.writeInt32BE(1, 4)
    body.writeInt16BE(clientId.length, 8)
    clientId.copy(body, 10)
    const len = Buffer.alloc(4)
    len.writeInt32BE(body.length)
    let buf = Buffer.alloc(0)
    s.on('data', (d) => {
      buf = Buffer.concat([buf, d])
      if (buf.length >= 4 && buf.length >= 4 + buf.readInt32BE(0)) {
        const keys = new Set()
        const n = buf.readInt32BE(10)
        for (let i = 0; i < n; i++) keys.add(buf.readInt16BE(14 + i * 6))
        s.destroy()
        resolve(keys)
      }
    })
    s.on('error', () => resolve(null))
    s.setTimeout(10000, () => { s.destroy(); resolve(null) })
    s.write(Buffer.concat([len, body]))
  })
}

function expected (tag) {
  const out = []
  for (let i = 0; i < RECORDS; i++) {
    out.push({ key: `key-${i % 10}`, value: `${tag}-value-${i}`, headers: { seq: String(i), client: 'kafkajs' } })
  }
  return out
}

const toMessages = (recs) => recs.map((r) => ({ key: r.key, value: r.value, headers: { ...r.headers } }))

// count, keys, values, headers and per-partition order
function check (got, want) {
  if (got.length !== want.length) return `expected ${want.length} records, got ${got.length}`
  const byValue = new Map(want.map((r, i) => [r.value, i]))
  const last = new Map()
  for (const g of got) {
    const v = g.message.value.toString()
    if (!byValue.has(v)) return `unexpected value ${v}`
    const i = byValue.get(v)
    byValue.delete(v)
    const w = want[i]
    if (g.message.key.toString() !== w.key) return `key ${g.message.key} != ${w.key} for ${v}`
    const h = Object.fromEntries(Object.entries(g.message.headers || {}).map(([k, x]) => [k, x.toString()]))
    if (JSON.stringify(h) !== JSON.stringify(w.headers)) return `headers ${JSON.stringify(h)} != ${JSON.stringify(w.headers)} for ${v}`
    const off = Number(g.message.offset)
    const p = last.get(g.partition)
    if (p && (i <= p.seq || off <= p.offset)) return `partition ${g.partition} out of order at offset ${off}`
    last.set(g.partition, { seq: i, offset: off })
  }
  return null
}

// Runs a consumer until n records with the prefix arrived (or timeout); returns them.
async function consumeUntil (consumer, topic, n, prefix, timeoutMs, onBatch) {
  const got = []
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  let done
  let crash = null
  const finished = new Promise((resolve) => { done = resolve })
  const timer = setTimeout(() => done(), timeoutMs)
  // a consumer that crashes stops quietly: surface the cause
  consumer.on(consumer.events.CRASH, (ev) => { crash = ev.payload.error; done() })
  await consumer.run({
    autoCommit: false,
    eachMessage: async (m) => {
      if (m.message.value.toString().startsWith(prefix)) got.push(m)
      if (got.length >= n) done()
    }
  })
  await finished
  clearTimeout(timer)
  if (crash) throw crash
  if (onBatch) await onBatch(got)
  return got
}

const timeout = (p, ms, what) => Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(`${what}: no answer in ${ms} ms`)), ms))])

const TXN_API_NAMES = { 24: 'AddPartitionsToTxn', 25: 'AddOffsetsToTxn', 26: 'EndTxn', 28: 'TxnOffsetCommit' }

async function main () {
  const bootstrap = process.argv[2]
  const [host, port] = bootstrap.split(':')
  const run = crypto.randomBytes(5).toString('hex')
  const topic = `compat-kjs-${run}`
  const group = `compat-kjs-group-${run}`
  const kafka = new Kafka({ clientId: 'strand-compat', brokers: [bootstrap], logLevel: logLevel.ERROR, logCreator, retry: { retries: 3 } })
  const keys = await brokerApiKeys(host, Number(port))
  const lacksInitProducerId = keys !== null && !keys.has(22)
  const gapOr = (cap, apis, what, e) => {
    if (lacksInitProducerId || e.name === 'KafkaJSNotImplemented' || /not supported|UNSUPPORTED/i.test(describe(e))) {
      result(cap, 'gap', `broker lacks ${apis}: ${what}: ${describe(e)}`)
    } else {
      result(cap, 'fail', `${what}: ${describe(e)}`)
    }
  }
  // A transactional path failed: a gap exactly when the broker does not
  // advertise an API the capability needs, otherwise a real failure.
  const txnFailure = (cap, needed, what, e) => {
    if (keys === null) {
      result(cap, 'fail', `${what}: ${describe(e)} (broker ApiVersions unknown)`)
      return
    }
    const lacking = needed.filter((k) => !keys.has(k)).map((k) => `${TXN_API_NAMES[k]}(${k})`)
    if (lacking.length) {
      result(cap, 'gap', `broker lacks ${lacking.join(', ')} (transactions, not in ApiVersions): ${what}: ${describe(e)}`)
    } else {
      result(cap, 'fail', `${what}: ${describe(e)}`)
    }
  }

  const admin = kafka.admin()
  await admin.connect()

  // admin
  try {
    const created = await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS, replicationFactor: 1 }], waitForLeaders: true })
    const md = await admin.fetchTopicMetadata({ topics: [topic] })
    const n = md.topics[0].partitions.length
    if (!created || n !== PARTITIONS) result('admin', 'fail', `createTopics returned ${created}, ${n} partitions in metadata`)
    else result('admin', 'pass', `createTopics ${PARTITIONS} partitions, fetchTopicMetadata agrees`)
  } catch (e) {
    result('admin', 'fail', `createTopics: ${describe(e)}`)
  }

  // produce
  const records = expected('plain')
  let produced = false
  try {
    const producer = kafka.producer({ idempotent: false, allowAutoTopicCreation: false })
    await producer.connect()
    await producer.send({ topic, acks: -1, messages: toMessages(records) })
    await producer.disconnect()
    produced = true
    result('produce', 'pass', `${RECORDS} keyed records with headers, acks=all`)
  } catch (e) {
    result('produce', 'fail', `send: ${describe(e)}`)
  }

  // end offsets through the admin API (ListOffsets)
  const endOffsets = async (t) => {
    const offs = await timeout(admin.fetchTopicOffsets(t), 20000, 'fetchTopicOffsets (ListOffsets)')
    return Object.fromEntries(offs.map((o) => [o.partition, Number(o.high)]))
  }

  // consume-group + committed-offsets
  if (!produced) {
    result('consume-group', 'fail', 'nothing produced')
    result('committed-offsets', 'fail', 'nothing produced')
  } else {
    let consumed = false
    try {
      const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, retry: { retries: 2 } })
      await consumer.connect()
      const got = await consumeUntil(consumer, topic, RECORDS, 'plain-', 30000, async (got) => {
        const next = {}
        for (const m of got) next[m.partition] = Math.max(next[m.partition] || 0, Number(m.message.offset) + 1)
        await consumer.commitOffsets(Object.entries(next).map(([p, o]) => ({ topic, partition: Number(p), offset: String(o) })))
      })
      await consumer.disconnect()
      const err = check(got, records)
      if (err) result('consume-group', 'fail', err)
      else { result('consume-group', 'pass', `subscribe, ${RECORDS} records checked, commitOffsets`); consumed = true }
    } catch (e) {
      result('consume-group', 'fail', `consume/commit: ${describe(e)}`)
    }
    if (consumed) {
      try {
        const fetched = await admin.fetchOffsets({ groupId: group, topics: [topic] })
        const committed = Object.fromEntries(fetched[0].partitions.map((p) => [p.partition, Number(p.offset)]))
        const ends = await endOffsets(topic)
        if (JSON.stringify(committed) !== JSON.stringify(ends)) result('committed-offsets', 'fail', `fetchOffsets ${JSON.stringify(committed)} != end offsets ${JSON.stringify(ends)}`)
        else result('committed-offsets', 'pass', `admin.fetchOffsets returns the end offsets ${JSON.stringify(ends)}`)
      } catch (e) {
        result('committed-offsets', 'fail', describe(e))
      }
    } else {
      result('committed-offsets', 'fail', 'not reached: consume failed')
    }
  }

  // idempotent
  try {
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    const recs = expected('idem')
    try {
      await producer.send({ topic, acks: -1, messages: toMessages(recs) })
    } finally {
      await producer.disconnect()
    }
    const consumer = kafka.consumer({ groupId: `${group}-idem` })
    await consumer.connect()
    const got = await consumeUntil(consumer, topic, RECORDS, 'idem-', 20000)
    await consumer.disconnect()
    const err = check(got, recs)
    result('idempotent', err ? 'fail' : 'pass', err || `idempotent: true, ${RECORDS} records checked`)
  } catch (e) {
    gapOr('idempotent', 'InitProducerId (idempotent producer)', 'idempotent produce', e)
  }

  // transactions
  try {
    const producer = kafka.producer({ transactionalId: `compat-kjs-tx-${run}`, idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    try {
      let txn = await producer.transaction()
      await txn.send({ topic, acks: -1, messages: toMessages(expected('aborted')) })
      await txn.abort()
      txn = await producer.transaction()
      await txn.send({ topic, acks: -1, messages: toMessages(expected('txn')) })
      await txn.commit()
    } finally {
      await producer.disconnect()
    }
    const consumer = kafka.consumer({ groupId: `${group}-rc`, readUncommitted: false })
    await consumer.connect()
    const all = await consumeUntil(consumer, topic, Infinity, '', 8000)
    await consumer.disconnect()
    if (all.some((m) => m.message.value.toString().startsWith('aborted-'))) {
      result('transactions', 'fail', 'read_committed consumer saw aborted records')
    } else {
      const err = check(all.filter((m) => m.message.value.toString().startsWith('txn-')), expected('txn'))
      result('transactions', err ? 'fail' : 'pass', err || `abort + commit, read_committed sees only the ${RECORDS} committed records`)
    }
  } catch (e) {
    txnFailure('transactions', [24, 26], 'transactional produce', e)
  }

  // consume-transform-produce
  try {
    const outTopic = `${topic}-out`
    const ctpGroup = `${group}-ctp`
    await admin.createTopics({ topics: [{ topic: outTopic, numPartitions: PARTITIONS, replicationFactor: 1 }], waitForLeaders: true })
    const producer = kafka.producer({ transactionalId: `compat-kjs-ctp-${run}`, idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    const consumer = kafka.consumer({ groupId: ctpGroup, readUncommitted: false })
    await consumer.connect()
    // offsets sent to the transaction: after the last transformed record per
    // partition (only the plain- records are transformed, so these are below
    // the end offsets: the topic holds later records of other capabilities)
    const sent = {}
    try {
      await consumeUntil(consumer, topic, RECORDS, 'plain-', 30000, async (got) => {
        const txn = await producer.transaction()
        try {
          await txn.send({ topic: outTopic, acks: -1, messages: got.map((m) => ({ key: m.message.key, value: m.message.value.toString().toUpperCase(), headers: m.message.headers })) })
          const next = sent
          for (const m of got) next[m.partition] = Math.max(next[m.partition] || 0, Number(m.message.offset) + 1)
          await txn.sendOffsets({ consumerGroupId: ctpGroup, topics: [{ topic, partitions: Object.entries(next).map(([p, o]) => ({ partition: Number(p), offset: String(o) })) }] })
          await txn.commit()
        } catch (e) {
          await txn.abort().catch(() => {})
          throw e
        }
      })
    } finally {
      await consumer.disconnect()
      await producer.disconnect()
    }
    const check2 = kafka.consumer({ groupId: `${ctpGroup}-check`, readUncommitted: false })
    await check2.connect()
    const out = await consumeUntil(check2, outTopic, RECORDS, 'PLAIN-', 20000)
    await check2.disconnect()
    let err = check(out, records.map((r) => ({ ...r, value: r.value.toUpperCase() })))
    if (!err) {
      const fetched = await admin.fetchOffsets({ groupId: ctpGroup, topics: [topic] })
      const committed = Object.fromEntries(fetched[0].partitions.map((p) => [p.partition, Number(p.offset)]))
      if (JSON.stringify(committed) !== JSON.stringify(sent)) err = `offsets committed with the transaction ${JSON.stringify(committed)} != offsets sent to it ${JSON.stringify(sent)}`
    }
    if (!err) {
      // a new member of the group resumes exactly at the committed offsets:
      // the first record it reads per partition is at the committed offset
      // (the next record there is a committed data record, idem-), and no
      // transformed (plain-) record is read again
      const resume = kafka.consumer({ groupId: ctpGroup, readUncommitted: false })
      await resume.connect()
      let again
      try {
        again = await consumeUntil(resume, topic, 2 * RECORDS, '', 20000)
      } finally {
        await resume.disconnect()
      }
      const first = {}
      for (const m of again) {
        if (m.message.value.toString().startsWith('plain-')) { err = `resumed member re-read ${m.message.value} at ${m.partition}/${m.message.offset}`; break }
        if (!(m.partition in first) || Number(m.message.offset) < first[m.partition]) first[m.partition] = Number(m.message.offset)
      }
      if (!err && JSON.stringify(first) !== JSON.stringify(sent)) err = `resumed member started at ${JSON.stringify(first)}, not at the committed offsets ${JSON.stringify(sent)}`
    }
    result('consume-transform-produce', err ? 'fail' : 'pass', err || `${RECORDS} records transformed in one transaction; committed offsets ${JSON.stringify(sent)} = offsets sent to it (last transformed + 1); a resumed member starts there`)
  } catch (e) {
    txnFailure('consume-transform-produce', [24, 25, 26, 28], 'consume-transform-produce', e)
  }

  await admin.disconnect()
}

main().then(() => process.exit(failed ? 1 : 0), (e) => {
  console.error(e)
  process.exit(2)
})
