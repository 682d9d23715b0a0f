//! strand-loadgen: a librdkafka load generator for Strand (or any Kafka broker).
//!
//! Goal: throughput and produce latency as a real client sees them.
//! Method: `--mode produce` sends `--records` records of `--record-size`
//! bytes through librdkafka's producer (acks, compression, linger and batch
//! size as given) and records, per record, the time from `send` to its
//! delivery callback in an HDR histogram; `--mode consume` reads the topic
//! from the beginning with an assigned consumer. The topic is created with
//! `--partitions` partitions if it does not exist. Prints one human line and
//! one JSON line. MB is 10^6 bytes of record values.
//!
//! Producer modes (JSON field `producer_mode`): `plain` (the default,
//! enable.idempotence=false), `idempotent` (`--idempotent`,
//! enable.idempotence=true) and `transactional` (`--transactional-id ID`:
//! init_transactions, then begin / send / commit, a commit as soon as
//! `--commit-interval-ms` have passed since the transaction began; the last
//! transaction is committed before the clock stops, and the run fails unless
//! every record was acknowledged and every commit succeeded, so the reported
//! rate is of committed records). Everything else (acks, linger, batch size,
//! queue limits) is the same in all three modes.
//!
//! Build: `cargo build --release --features loadgen --bin strand-loadgen`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Produce,
    Consume,
    /// End-to-end latency at a fixed rate: one producer sends `--rate`
    /// records/s for `--duration-s` s (after `--warmup-s` s not measured),
    /// each value stamped with its send time; a consumer in the same
    /// process reads them and records receive time minus send time.
    Latency,
    /// Time to the first acknowledged record: one record, retried quickly
    /// while the broker is still starting; prints the wall-clock time (Unix
    /// ms) of its delivery so a caller that noted when it started the broker
    /// gets "start to first produce". No topic set-up first.
    FirstProduce,
    /// Deletes `--topic` (a comma-separated list) and waits until metadata no
    /// longer lists it: benches/compare clears each run's topics so the next
    /// run starts from the same state.
    DeleteTopic,
}

#[derive(Parser, Debug)]
#[command(name = "strand-loadgen", about = "librdkafka load generator: records/s, MB/s, produce latency")]
struct Args {
    /// bootstrap.servers
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long, default_value = "loadgen")]
    topic: String,
    /// Records to produce (or to consume; consume also stops at the end of every partition).
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Value size in bytes (keys are null).
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Partitions for the topic if it has to be created.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// Replication factor for the topic if it has to be created.
    #[arg(long, default_value_t = 1)]
    replication_factor: i32,
    /// A config of the topic if it has to be created, e.g. `min.insync.replicas=1` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    topic_config: Vec<String>,
    /// acks: all, -1, 0 or 1.
    #[arg(long, default_value = "all")]
    acks: String,
    /// compression.type: none, gzip, snappy, lz4, zstd.
    #[arg(long, default_value = "none")]
    compression: String,
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// batch.size in bytes.
    #[arg(long, default_value_t = 1_000_000)]
    batch_size: usize,
    #[arg(long, value_enum, default_value = "produce")]
    mode: Mode,
    /// Seed for the record values (values are pseudo-random, so barely compressible).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// queue.buffering.max.kbytes: the client-side buffer. The default lets a
    /// run enqueue everything at once; 32768 bounds it like the Java client's
    /// buffer.memory (32 MiB), so sends wait for deliveries.
    #[arg(long, default_value_t = 1_048_576)]
    queue_kbytes: u64,
    /// max.in.flight.requests.per.connection (librdkafka's default if unset;
    /// idempotent and transactional producers allow at most 5).
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Before the clock starts, produce (and for --transactional-id commit) one
    /// warm-up record and wait for it, so connection set-up, metadata and the
    /// producer id are not timed. Not counted in --records or the latencies.
    #[arg(long)]
    warmup: bool,
    /// Extra librdkafka property for every client, like kcat's -X (repeatable), e.g. `-X debug=eos`.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    extra: Vec<String>,
    /// Idempotent producer (enable.idempotence=true; needs acks=all).
    #[arg(long, conflicts_with = "transactional_id")]
    idempotent: bool,
    /// Transactional producer with this transactional.id (implies idempotence):
    /// init_transactions, then begin / send / commit every --commit-interval-ms.
    #[arg(long)]
    transactional_id: Option<String>,
    /// With --transactional-id: commit once this many ms have passed since the
    /// transaction began (the commit itself waits for every record in it).
    #[arg(long, default_value_t = 100, requires = "transactional_id")]
    commit_interval_ms: u64,
    /// Consumers' max.partition.fetch.bytes (librdkafka's default: 1 MiB).
    #[arg(long, default_value_t = 1_048_576)]
    max_partition_fetch_bytes: u64,
    /// Consumers' fetch.max.bytes (librdkafka's default: 50 MiB).
    #[arg(long, default_value_t = 52_428_800)]
    fetch_max_bytes: u64,
    /// Consumers' fetch.queue.backoff.ms. librdkafka's default (1000) stops
    /// fetching for a second whenever its prefetch queue passes
    /// queued.min.messages (100000) or queued.max.messages.kbytes, so against
    /// a broker that answers fast the consumer idles most of the time and the
    /// run measures that pause, not the broker; 10 ms keeps it fetching.
    #[arg(long, default_value_t = 10)]
    fetch_queue_backoff_ms: u64,
    /// --mode produce: send at most this many records per second (paced on a
    /// fixed schedule) instead of as fast as the client takes them, e.g. to
    /// time a failover under a steady load (`max_ack_gap_ms`).
    #[arg(long)]
    produce_rate: Option<u64>,
    /// --mode latency: records per second, sent on a fixed schedule.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// --mode latency: measured seconds.
    #[arg(long, default_value_t = 10.0)]
    duration_s: f64,
    /// --mode latency: seconds at the rate before measuring starts.
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// --mode first-produce: give up after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout_s: f64,
    /// With --transactional-id: transaction.timeout.ms (librdkafka wants it >= message.timeout.ms, 120 s here).
    #[arg(long, default_value_t = 120_000, requires = "transactional_id")]
    transaction_timeout_ms: u64,
}

impl Args {
    fn producer_mode(&self) -> &'static str {
        if self.transactional_id.is_some() {
            "transactional"
        } else if self.idempotent {
            "idempotent"
        } else {
            "plain"
        }
    }
}

/// Delivery-callback latency in microseconds, acknowledged records, plus error count.
struct LatencyContext {
    /// Time zero of the send times in the delivery opaques.
    origin: Instant,
    histogram: Mutex<Histogram<u64>>,
    delivered: AtomicU64,
    errors: Mutex<(u64, Option<String>)>,
    /// Nanoseconds since `origin` of the last acknowledgement (0: none yet).
    last_ack_ns: AtomicU64,
    /// The longest time between two acknowledgements: across a leader's
    /// death it is the failover as the producer saw it.
    max_ack_gap_ns: AtomicU64,
}

impl ClientContext for LatencyContext {
    /// librdkafka's log lines (errors only unless `-X log_level=7 -X debug=...`) go to stderr.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("librdkafka {level:?} {fac}: {log_message}");
    }
}

impl ProducerContext for LatencyContext {
    /// The send time in nanoseconds since `origin`: carried in the opaque
    /// pointer itself, so timing a record allocates nothing (a boxed
    /// `Instant` per record cost a malloc and a cross-thread free, which is
    /// load-generator work, not broker work).
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Self::DeliveryOpaque) {
        let micros = (self.origin.elapsed().as_nanos() as u64).saturating_sub(sent as u64).div_ceil(1000).max(1);
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                self.histogram.lock().unwrap().saturating_record(micros);
                let now = self.origin.elapsed().as_nanos() as u64;
                let last = self.last_ack_ns.swap(now, Ordering::Relaxed);
                if last != 0 {
                    self.max_ack_gap_ns.fetch_max(now.saturating_sub(last), Ordering::Relaxed);
                }
            }
            Err((e, _)) => {
                let mut errors = self.errors.lock().unwrap();
                errors.0 += 1;
                errors.1.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

fn base_config(args: &Args) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &args.bootstrap).set("log_level", "3");
    for kv in &args.extra {
        let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        c.set(k, v);
    }
    c
}

/// Creates the topic unless it exists; returns its partition count.
fn ensure_topic(args: &Args) -> Result<i32, String> {
    let consumer: BaseConsumer = base_config(args).create().map_err(|e| e.to_string())?;
    let existing = |consumer: &BaseConsumer| -> Result<Option<i32>, String> {
        let md = consumer.fetch_metadata(Some(&args.topic), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        Ok(md
            .topics()
            .first()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len() as i32))
    };
    if let Some(n) = existing(&consumer)? {
        return Ok(n);
    }
    let admin: AdminClient<DefaultClientContext> = base_config(args).create().map_err(|e| e.to_string())?;
    let mut topic = NewTopic::new(&args.topic, args.partitions, TopicReplication::Fixed(args.replication_factor));
    for kv in &args.topic_config {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--topic-config {kv}: expected KEY=VALUE"))?;
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let results = rt.block_on(admin.create_topics([&topic], &opts)).map_err(|e| e.to_string())?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("cannot create topic {t}: {e}")),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(n) = existing(&consumer)? {
            return Ok(n);
        }
        if Instant::now() > deadline {
            return Err(format!("topic {} did not appear in metadata", args.topic));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn payload(args: &Args) -> Vec<u8> {
    let mut state = args.seed;
    (0..args.record_size)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect()
}

fn produce(args: &Args, partitions: i32) -> Result<serde_json::Value, String> {
    let origin = Instant::now();
    let context = LatencyContext {
        origin,
        histogram: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")),
        delivered: AtomicU64::new(0),
        errors: Mutex::new((0, None)),
        last_ack_ns: AtomicU64::new(0),
        max_ack_gap_ns: AtomicU64::new(0),
    };
    let mut config = producer_config(args);
    if let Some(id) = &args.transactional_id {
        config.set("transactional.id", id).set("transaction.timeout.ms", args.transaction_timeout_ms.to_string());
    }
    let producer: ThreadedProducer<LatencyContext> = config.create_with_context(context).map_err(|e| e.to_string())?;
    let transactional = args.transactional_id.is_some();
    let commit_interval = Duration::from_millis(args.commit_interval_ms);
    let txn_timeout = Duration::from_secs(300);
    // Transaction errors say whether they are fatal, retriable or need an abort.
    let txn_error = |what: &str, n: u64, e: KafkaError| -> String {
        let kind = match e.rdkafka_error_code() {
            Some(code) => format!("{code:?}"),
            None => "no code".to_string(),
        };
        let flags = match &e {
            KafkaError::Transaction(t) => {
                format!(
                    " (fatal={}, retriable={}, txn_requires_abort={})",
                    t.is_fatal(),
                    t.is_retriable(),
                    t.txn_requires_abort()
                )
            }
            _ => String::new(),
        };
        format!("{what} failed in transaction {n}: {e} [{kind}]{flags}")
    };
    if transactional {
        // Not timed: one-off set-up (FindCoordinator + InitProducerId).
        producer.init_transactions(Duration::from_secs(60)).map_err(|e| txn_error("init_transactions", 0, e))?;
    }
    let value = payload(args);
    if args.warmup {
        let record = BaseRecord::<(), [u8], usize>::with_opaque_to(&args.topic, origin.elapsed().as_nanos() as usize)
            .payload(&value);
        if transactional {
            producer.begin_transaction().map_err(|e| txn_error("begin_transaction", 0, e))?;
        }
        producer.send(record).map_err(|(e, _)| format!("warm-up send: {e}"))?;
        if transactional {
            producer.commit_transaction(txn_timeout).map_err(|e| txn_error("commit_transaction (warm-up)", 0, e))?;
        }
        wait_delivered(&producer, Duration::from_secs(60)).map_err(|e| format!("warm-up flush: {e}"))?;
        let context = producer.context();
        if let (n @ 1.., first) = context.errors.lock().unwrap().clone() {
            return Err(format!("warm-up record failed ({n}): {}", first.unwrap_or_default()));
        }
        context.delivered.store(0, Ordering::Relaxed);
        context.histogram.lock().unwrap().reset();
        context.last_ack_ns.store(0, Ordering::Relaxed);
        context.max_ack_gap_ns.store(0, Ordering::Relaxed);
    }
    let started = Instant::now();
    let mut sent = 0u64;
    let mut transactions = 0u64;
    // Per commit: the flush (waiting for the transaction's records) and EndTxn
    // (commit_transaction after the flush: EndTxn and the broker's markers).
    let (mut flush_total, mut end_total, mut end_max) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut commit = |n: u64| -> Result<(), String> {
        let t0 = Instant::now();
        wait_delivered(&producer, txn_timeout).map_err(|e| format!("flush before commit in transaction {n}: {e}"))?;
        let t1 = Instant::now();
        producer.commit_transaction(txn_timeout).map_err(|e| txn_error("commit_transaction", n, e))?;
        let end = t1.elapsed();
        flush_total += t1 - t0;
        end_total += end;
        end_max = end_max.max(end);
        Ok(())
    };
    if transactional {
        producer.begin_transaction().map_err(|e| txn_error("begin_transaction", 1, e))?;
        transactions = 1;
    }
    // One clock read per record in every mode (the record's send time, which
    // also decides when to commit), so the transactional mode costs the
    // client no more per record than the others.
    let mut commit_at = origin.elapsed() + commit_interval;
    // With --produce-rate, record i is sent no earlier than started + i / rate.
    let pace = args.produce_rate.map(|rate| Duration::from_secs_f64(1.0 / rate as f64));
    while sent < args.records {
        if let Some(interval) = pace {
            let due = started + interval.mul_f64(sent as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let now = origin.elapsed();
        if transactional && now >= commit_at {
            commit(transactions)?;
            producer.begin_transaction().map_err(|e| txn_error("begin_transaction", transactions + 1, e))?;
            transactions += 1;
            commit_at = origin.elapsed() + commit_interval;
            continue; // read the clock again: the record's send time is after the commit
        }
        let record =
            BaseRecord::<(), [u8], usize>::with_opaque_to(&args.topic, now.as_nanos() as usize).payload(&value);
        match producer.send(record) {
            Ok(()) => sent += 1,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // The local queue is full: wait for deliveries to make room.
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(format!("send failed after {sent} records: {e}")),
        }
    }
    if transactional {
        // commit_transaction flushes: the last record is acknowledged and committed before the clock stops.
        commit(transactions)?;
    }
    wait_delivered(&producer, Duration::from_secs(300)).map_err(|e| format!("flush: {e}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    let context = producer.context();
    let delivered = context.delivered.load(Ordering::Relaxed);
    let (errors, first_error) = context.errors.lock().unwrap().clone();
    let h = context.histogram.lock().unwrap().clone();
    let rps = args.records as f64 / elapsed;
    let mbps = rps * args.record_size as f64 / 1e6;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let max_ack_gap_ms = context.max_ack_gap_ns.load(Ordering::Relaxed) as f64 / 1e6;
    // The plain line is unchanged from before the producer modes existed.
    let mode_note = match &args.transactional_id {
        Some(id) => format!(
            ", producer=transactional id={id} commit.interval.ms={} transactions={transactions} \
             commit flush {:.0} ms + EndTxn {:.0} ms (max {:.1} ms)",
            args.commit_interval_ms,
            flush_total.as_secs_f64() * 1e3,
            end_total.as_secs_f64() * 1e3,
            end_max.as_secs_f64() * 1e3
        ),
        None if args.idempotent => ", producer=idempotent".to_string(),
        None => String::new(),
    };
    println!(
        "produce {} records x {} B to {} ({} partitions, acks={}, compression={}, linger.ms={}, batch.size={}{}): \
         {:.2} s, {:.0} records/s, {:.1} MB/s, latency p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms max {:.2} ms, \
         longest gap between acknowledgements {:.1} ms, {} errors",
        args.records,
        args.record_size,
        args.topic,
        partitions,
        args.acks,
        args.compression,
        args.linger_ms,
        args.batch_size,
        mode_note,
        elapsed,
        rps,
        mbps,
        ms(0.5),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1000.0,
        max_ack_gap_ms,
        errors
    );
    let mut json = serde_json::json!({
        "mode": "produce", "producer_mode": args.producer_mode(),
        "topic": args.topic, "partitions": partitions, "records": args.records,
        "record_size": args.record_size, "acks": args.acks, "compression": args.compression,
        "linger_ms": args.linger_ms, "batch_size": args.batch_size, "seconds": elapsed,
        "records_per_sec": rps, "mb_per_sec": mbps,
        "latency_ms": {"p50": ms(0.5), "p99": ms(0.99), "p99_9": ms(0.999), "max": h.max() as f64 / 1000.0},
        "errors": errors, "acknowledged": delivered, "queue_kbytes": args.queue_kbytes, "warmup": args.warmup,
        "max_ack_gap_ms": max_ack_gap_ms, "produce_rate": args.produce_rate,
    });
    if let Some(n) = args.max_in_flight {
        json["max_in_flight"] = n.into();
    }
    if let Some(id) = &args.transactional_id {
        json["transactional_id"] = id.as_str().into();
        json["commit_interval_ms"] = args.commit_interval_ms.into();
        json["transactions"] = transactions.into();
        json["commit_flush_ms_total"] = (flush_total.as_secs_f64() * 1e3).into();
        json["end_txn_ms_total"] = (end_total.as_secs_f64() * 1e3).into();
        json["end_txn_ms_max"] = (end_max.as_secs_f64() * 1e3).into();
    }
    if errors > 0 {
        println!("{json}");
        return Err(format!("{errors} records failed, first: {}", first_error.unwrap_or_default()));
    }
    if delivered != args.records {
        println!("{json}");
        return Err(format!("only {delivered} of {} records were acknowledged", args.records));
    }
    Ok(json)
}

/// A consumer assigned every partition of `--topic` from `start` (no group
/// membership, no commits), with the fetch settings given on the command line.
fn assigned_consumer(args: &Args, partitions: i32, start: Offset, eof: bool) -> Result<BaseConsumer, String> {
    let consumer: BaseConsumer = base_config(args)
        .set("group.id", "strand-loadgen")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", eof.to_string())
        .set("fetch.max.bytes", args.fetch_max_bytes.to_string())
        .set("max.partition.fetch.bytes", args.max_partition_fetch_bytes.to_string())
        .set("fetch.queue.backoff.ms", args.fetch_queue_backoff_ms.to_string())
        .create()
        .map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&args.topic, p, start).map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    Ok(consumer)
}

fn consume(args: &Args, partitions: i32) -> Result<serde_json::Value, String> {
    let consumer = assigned_consumer(args, partitions, Offset::Beginning, true)?;
    let started = Instant::now();
    let (mut records, mut bytes, mut at_end) = (0u64, 0u64, std::collections::HashSet::new());
    // No clock reads or hashing per record: they are client CPU on the
    // cores the broker shares. Idleness is checked only when a poll times out.
    let (mut idle_since, mut records_at_idle_check) = (Instant::now(), 0u64);
    while records < args.records && at_end.len() < partitions as usize {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                records += 1;
                bytes += m.payload_len() as u64;
                if !at_end.is_empty() {
                    at_end.remove(&m.partition());
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(format!("consumer error after {records} records: {e}")),
            None if records != records_at_idle_check => {
                (idle_since, records_at_idle_check) = (Instant::now(), records);
            }
            None => {
                if idle_since.elapsed() > Duration::from_secs(30) {
                    return Err(format!("no records for 30 s after {records}"));
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rps = records as f64 / elapsed;
    let mbps = bytes as f64 / elapsed / 1e6;
    println!(
        "consume {records} records ({bytes} B) from {} ({partitions} partitions): {elapsed:.2} s, {rps:.0} records/s, {mbps:.1} MB/s",
        args.topic
    );
    Ok(serde_json::json!({
        "mode": "consume", "topic": args.topic, "partitions": partitions, "records": records, "bytes": bytes,
        "seconds": elapsed, "records_per_sec": rps, "mb_per_sec": mbps,
    }))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = match args.mode {
        Mode::FirstProduce => first_produce(&args),
        Mode::DeleteTopic => delete_topics(&args),
        _ => ensure_topic(&args).and_then(|partitions| match args.mode {
            Mode::Produce => produce(&args, partitions),
            Mode::Consume => consume(&args, partitions),
            Mode::Latency => latency(&args, partitions),
            Mode::FirstProduce | Mode::DeleteTopic => unreachable!("handled above"),
        }),
    };
    match result {
        Ok(json) => {
            println!("{json}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("strand-loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What the latency mode's consumer thread saw: the latency histogram (ns),
/// records received, the slowest record as (latency ns, send time ns), and
/// the slowest latency (ns) per timeline bucket of send time.
type ConsumerTally = (Histogram<u64>, u64, (u64, u64), Vec<u64>);

/// Quantiles reported for `--mode latency` (and plotted by benches/compare).
const LATENCY_QUANTILES: [f64; 13] = [0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999];

/// Producer settings shared by the produce and latency modes.
fn producer_config(args: &Args) -> ClientConfig {
    let mut config = base_config(args);
    config
        .set("acks", &args.acks)
        .set("compression.type", &args.compression)
        .set("linger.ms", args.linger_ms.to_string())
        .set("batch.size", args.batch_size.to_string())
        .set("enable.idempotence", if args.producer_mode() == "plain" { "false" } else { "true" })
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", args.queue_kbytes.to_string())
        .set("message.timeout.ms", "120000");
    if let Some(n) = args.max_in_flight {
        config.set("max.in.flight.requests.per.connection", n.to_string());
    }
    config
}

/// Counts deliveries and failures; the latency mode measures at the consumer.
struct CountingContext {
    delivered: AtomicU64,
    errors: Mutex<(u64, Option<String>)>,
}

impl ClientContext for CountingContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("librdkafka {level:?} {fac}: {log_message}");
    }
}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                let mut errors = self.errors.lock().unwrap();
                errors.0 += 1;
                errors.1.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Width of the buckets of the latency mode's timeline (slowest record by send time).
const TIMELINE_BUCKET_NS: u64 = 250_000_000;

fn latency(args: &Args, partitions: i32) -> Result<serde_json::Value, String> {
    if args.record_size < 16 {
        return Err("--mode latency needs --record-size >= 16 (the value carries its send time)".into());
    }
    if args.rate == 0 || args.duration_s <= 0.0 {
        return Err("--mode latency needs --rate > 0 and --duration-s > 0".into());
    }
    // Every time is nanoseconds since `origin`, shared by the producing and
    // consuming threads of this one process.
    let origin = Instant::now();
    let now_ns = move || origin.elapsed().as_nanos() as u64;
    let warmup = Duration::from_secs_f64(args.warmup_s.max(0.0));
    let measured = Duration::from_secs_f64(args.duration_s);
    let total_records = ((warmup + measured).as_secs_f64() * args.rate as f64).round() as u64;
    let measured_records = (measured.as_secs_f64() * args.rate as f64).round() as u64;
    let first_measured_seq = total_records - measured_records;

    let consumer = assigned_consumer(args, partitions, Offset::End, false)?;

    let context = CountingContext { delivered: AtomicU64::new(0), errors: Mutex::new((0, None)) };
    let producer: ThreadedProducer<CountingContext> =
        producer_config(args).create_with_context(context).map_err(|e| e.to_string())?;
    let mut value = payload(args);
    let send = |value: &mut Vec<u8>, seq: u64| -> Result<(), String> {
        value[0..8].copy_from_slice(&now_ns().to_le_bytes());
        value[8..16].copy_from_slice(&seq.to_le_bytes());
        loop {
            match producer.send(BaseRecord::<(), [u8], ()>::to(&args.topic).payload(&value[..])) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Err((e, _)) => return Err(format!("send failed at record {seq}: {e}")),
            }
        }
    };

    // Until the consumer sees a probe record, its fetch position is not
    // settled; probes (seq u64::MAX) are sent every 100 ms until one arrives.
    let probe_deadline = Instant::now() + Duration::from_secs(60);
    'probe: loop {
        send(&mut value, u64::MAX)?;
        let sent_at = Instant::now();
        while sent_at.elapsed() < Duration::from_millis(100) {
            match consumer.poll(Duration::from_millis(10)) {
                Some(Ok(m)) if m.payload().is_some_and(|v| v.len() >= 16) => break 'probe,
                Some(Err(e)) => return Err(format!("consumer error before the run: {e}")),
                _ => {}
            }
        }
        if Instant::now() > probe_deadline {
            return Err("the consumer saw no probe record within 60 s".into());
        }
    }

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer_thread = {
        let done = done.clone();
        std::thread::spawn(move || -> Result<ConsumerTally, String> {
            let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds");
            let (mut received, mut last_seq_seen) = (0u64, 0u64);
            // The slowest record: (latency ns, send time ns since origin).
            let mut worst = (0u64, 0u64);
            // The slowest latency per TIMELINE_BUCKET_NS of send time, so
            // stalls can be lined up with the broker's log (rolls, flushes).
            let mut timeline: Vec<u64> = Vec::new();
            let mut idle_since = Instant::now();
            while received < total_records {
                match consumer.poll(Duration::from_millis(50)) {
                    Some(Ok(m)) => {
                        let at = now_ns();
                        idle_since = Instant::now();
                        let Some(v) = m.payload().filter(|v| v.len() >= 16) else { continue };
                        let sent = u64::from_le_bytes(v[0..8].try_into().unwrap());
                        let seq = u64::from_le_bytes(v[8..16].try_into().unwrap());
                        if seq == u64::MAX {
                            continue; // a late probe
                        }
                        received += 1;
                        last_seq_seen = last_seq_seen.max(seq);
                        if seq >= first_measured_seq {
                            let latency = at.saturating_sub(sent).max(1);
                            h.saturating_record(latency);
                            if latency > worst.0 {
                                worst = (latency, sent);
                            }
                            let bucket = (sent / TIMELINE_BUCKET_NS) as usize;
                            if timeline.len() <= bucket {
                                timeline.resize(bucket + 1, 0);
                            }
                            timeline[bucket] = timeline[bucket].max(latency);
                        }
                    }
                    Some(Err(e)) => return Err(format!("consumer error after {received} records: {e}")),
                    None => {
                        if done.load(Ordering::Relaxed) && idle_since.elapsed() > Duration::from_secs(30) {
                            return Err(format!("consumer got {received} of {total_records} records"));
                        }
                    }
                }
            }
            Ok((h, received, worst, timeline))
        })
    };

    // Record i is due at start + i / rate. The thread sleeps until the next
    // record is due and then sends every record that is due (no spinning:
    // a busy core would be taken from the broker and the client on a small
    // machine); how far sends fell behind schedule is reported.
    let start = Instant::now();
    let interval_ns = 1e9 / args.rate as f64;
    let due = |seq: u64| start + Duration::from_nanos((seq as f64 * interval_ns) as u64);
    let mut behind_max = Duration::ZERO;
    let mut seq = 0u64;
    while seq < total_records {
        let now = Instant::now();
        let next = due(seq);
        if next > now {
            std::thread::sleep(next - now);
            continue;
        }
        behind_max = behind_max.max(now - next);
        while seq < total_records && due(seq) <= now {
            send(&mut value, seq)?;
            seq += 1;
        }
    }
    let send_seconds = start.elapsed().as_secs_f64();
    wait_delivered(&producer, Duration::from_secs(120)).map_err(|e| format!("flush: {e}"))?;
    done.store(true, Ordering::Relaxed);
    let (h, received, worst, timeline) =
        consumer_thread.join().map_err(|_| "consumer thread panicked".to_string())??;
    let (errors, first_error) = producer.context().errors.lock().unwrap().clone();
    if errors > 0 {
        return Err(format!("{errors} records failed, first: {}", first_error.unwrap_or_default()));
    }
    let achieved_rate = total_records as f64 / send_seconds;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e6;
    let curve: Vec<serde_json::Value> = LATENCY_QUANTILES.iter().map(|&q| serde_json::json!([q, ms(q)])).collect();
    println!(
        "latency at {} records/s ({} B, {} partitions, acks={}, linger.ms={}; achieved {:.0} records/s, \
         at most {:.1} ms behind schedule): {} records measured, p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms max {:.2} ms",
        args.rate,
        args.record_size,
        partitions,
        args.acks,
        args.linger_ms,
        achieved_rate,
        behind_max.as_secs_f64() * 1e3,
        h.len(),
        ms(0.5),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1e6
    );
    Ok(serde_json::json!({
        "mode": "latency", "topic": args.topic, "partitions": partitions, "record_size": args.record_size,
        "acks": args.acks, "linger_ms": args.linger_ms, "rate": args.rate, "achieved_rate": achieved_rate,
        "behind_schedule_ms_max": behind_max.as_secs_f64() * 1e3,
        "records": total_records, "received": received, "measured": h.len(),
        "slowest_sent_at_s": worst.1 as f64 / 1e9,
        "latency_ms": {"p50": ms(0.5), "p99": ms(0.99), "p99_9": ms(0.999), "max": h.max() as f64 / 1e6},
        "percentiles_ms": curve,
        "timeline_bucket_s": TIMELINE_BUCKET_NS as f64 / 1e9,
        "max_ms_by_send_time": timeline.iter().map(|&ns| (ns as f64 / 1e4).round() / 100.0).collect::<Vec<_>>(),
    }))
}

fn first_produce(args: &Args) -> Result<serde_json::Value, String> {
    let started = Instant::now();
    let context = CountingContext { delivered: AtomicU64::new(0), errors: Mutex::new((0, None)) };
    // Short back-offs so the probe notices a listening broker within ~10 ms;
    // librdkafka keeps the record queued while it cannot connect.
    let producer: ThreadedProducer<CountingContext> = producer_config(args)
        .set("log_level", "0")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "10")
        .set("retry.backoff.ms", "10")
        .set("retry.backoff.max.ms", "10")
        .set("topic.metadata.refresh.fast.interval.ms", "10")
        .set("message.timeout.ms", ((args.timeout_s * 1000.0) as u64).max(1).to_string())
        .create_with_context(context)
        .map_err(|e| e.to_string())?;
    let value = payload(args);
    producer
        .send(BaseRecord::<(), [u8], ()>::to(&args.topic).payload(&value[..]))
        .map_err(|(e, _)| format!("send: {e}"))?;
    let deadline = started + Duration::from_secs_f64(args.timeout_s);
    loop {
        let context = producer.context();
        if context.delivered.load(Ordering::Relaxed) == 1 {
            break;
        }
        if let (1.., Some(e)) = context.errors.lock().unwrap().clone() {
            return Err(format!("the record failed: {e}"));
        }
        if Instant::now() > deadline {
            return Err(format!("no record acknowledged within {} s", args.timeout_s));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs_f64() * 1e3;
    let waited = started.elapsed().as_secs_f64();
    println!("first produce acknowledged after {:.3} s of trying (to {})", waited, args.topic);
    Ok(serde_json::json!({
        "mode": "first-produce", "topic": args.topic, "delivered_unix_ms": unix_ms, "seconds_trying": waited,
    }))
}

fn delete_topics(args: &Args) -> Result<serde_json::Value, String> {
    let topics: Vec<&str> = args.topic.split(',').filter(|t| !t.is_empty()).collect();
    let admin: AdminClient<DefaultClientContext> = base_config(args).create().map_err(|e| e.to_string())?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    for r in rt.block_on(admin.delete_topics(&topics, &opts)).map_err(|e| e.to_string())? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, e)) => return Err(format!("cannot delete topic {t}: {e}")),
        }
    }
    let consumer: BaseConsumer = base_config(args).create().map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let md = consumer.fetch_metadata(None, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        if !md.topics().iter().any(|t| topics.contains(&t.name())) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("topics {topics:?} still listed 60 s after deletion"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("deleted {}", topics.join(","));
    Ok(serde_json::json!({"mode": "delete-topic", "topics": topics}))
}

/// Waits until every record sent so far has been acknowledged (or failed) and
/// its delivery report handled. Not `Producer::flush`: with a
/// `ThreadedProducer`, rdkafka's flush polls the main queue for up to 100 ms
/// per round while the producer's own thread takes the delivery reports, so
/// every flush (each commit, the end of each run) lasted at least 100 ms
/// whatever the broker did. Checking the out-queue every 100 us costs nothing.
fn wait_delivered<C: ProducerContext>(producer: &ThreadedProducer<C>, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err(format!("{} records not acknowledged within {timeout:?}", producer.in_flight_count()));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}
