//! Shared helpers for the integration tests: an in-process broker on
//! 127.0.0.1:0 in a temporary directory, rdkafka client configs, a raw
//! protocol connection built on the `kafka-protocol` crate, deadline-bounded
//! waiting, and helpers for running the real `strand` binary as a child.
#![allow(dead_code)]

pub mod child;
pub mod child_cluster;
pub mod cluster;
pub mod ports;

use std::future::Future;
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use rdkafka::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A broker running inside the test process, with its data directory.
pub struct TestBroker {
    pub handle: strand::BrokerHandle,
    pub dir: tempfile::TempDir,
}

impl TestBroker {
    pub fn bootstrap(&self) -> String {
        self.handle.bootstrap_servers()
    }
    pub fn addr(&self) -> SocketAddr {
        self.handle.addr()
    }
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
    /// `<log.dirs>/<topic>-<partition>`.
    pub fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.log_dir().join(format!("{topic}-{partition}"))
    }
    pub async fn shutdown(self) -> tempfile::TempDir {
        self.handle.shutdown().await;
        self.dir
    }
}

/// Server properties for a single node listening on `listener_port` with data in `log_dir`.
pub fn properties(log_dir: &Path, listener_port: u16) -> String {
    format!(
        "node.id=1\nlisteners=PLAINTEXT://127.0.0.1:{listener_port}\nlog.dirs={}\n\
         num.partitions=1\ndefault.replication.factor=1\n",
        log_dir.display()
    )
}

/// Starts an in-process broker on 127.0.0.1:0 with data in a fresh temporary
/// directory; `overrides` are `key=value` strings applied on top.
pub async fn start_broker(overrides: &[&str]) -> TestBroker {
    let dir = tempfile::tempdir().expect("tempdir");
    start_broker_in(dir, overrides).await
}

/// Starts an in-process broker with its data under `dir/data` (for restarts).
pub async fn start_broker_in(dir: tempfile::TempDir, overrides: &[&str]) -> TestBroker {
    let log_dir = dir.path().join("data");
    let text = properties(&log_dir, 0);
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let config = strand::BrokerConfig::from_properties(&text, "test", &overrides).expect("test config parses");
    let handle = strand::Broker::start(config).await.expect("broker starts");
    TestBroker { handle, dir }
}

/// Base rdkafka config: bootstrap servers, short timeouts, quiet logging.
pub fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("socket.timeout.ms", "10000")
        .set("log_level", "3");
    c
}

/// Producer config: acks=all, no idempotence (the broker refuses producer ids for now).
pub fn producer_config(bootstrap: &str) -> ClientConfig {
    let mut c = base_config(bootstrap);
    c.set("acks", "all").set("enable.idempotence", "false").set("message.timeout.ms", "30000").set("linger.ms", "5");
    c
}

/// Consumer config for manual assignment (no group coordinator is needed).
pub fn consumer_config(bootstrap: &str) -> ClientConfig {
    let mut c = base_config(bootstrap);
    c.set("group.id", "strand-tests")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("check.crcs", "true")
        .set("enable.partition.eof", "true");
    c
}

pub fn admin_config(bootstrap: &str) -> ClientConfig {
    base_config(bootstrap)
}

/// Polls `check` every `interval` until it returns `Some`, or panics with
/// `what` once `timeout` has passed.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, interval: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Waits (polling, bounded) until `addr` accepts TCP connections.
/// Polls (bounded) until `check` says yes; returns the time it took.
pub async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    wait_for(what, timeout, Duration::from_millis(20), || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await;
    started.elapsed()
}

pub fn wait_for_port(addr: SocketAddr, timeout: Duration, mut still_running: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if StdTcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        assert!(still_running(), "the broker exited before accepting on {addr}");
        assert!(Instant::now() < deadline, "{addr} did not accept connections within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Seed for randomised tests: `STRAND_TEST_SEED` if set, else from the clock. Printed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("STRAND_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("{test}: seed {seed} (rerun with STRAND_TEST_SEED={seed})");
    seed
}

/// splitmix64: a tiny deterministic generator, enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A raw Kafka protocol connection: frames requests with the kafka-protocol
/// crate and decodes responses.
pub struct RawConn {
    pub stream: TcpStream,
    next_correlation_id: i32,
}

/// How long a raw connection waits for a response or for the broker to close.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(10);

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect(addr).await.expect("connect to broker");
        stream.set_nodelay(true).ok();
        RawConn { stream, next_correlation_id: 1 }
    }

    /// Encodes header + body of `req` at `version` (no size prefix).
    pub fn encode_request<R: Request>(req: &R, version: i16, correlation_id: i32) -> BytesMut {
        let api_key = ApiKey::try_from(R::KEY).expect("known key");
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("strand-raw-test")));
        let mut buf = BytesMut::new();
        header.encode(&mut buf, api_key.request_header_version(version)).expect("header encodes");
        req.encode(&mut buf, version).expect("request encodes");
        buf
    }

    /// Writes one frame: i32 size then `body`.
    pub async fn write_frame(&mut self, body: &[u8]) -> std::io::Result<()> {
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.put_slice(body);
        self.stream.write_all(&frame).await
    }

    /// Sends `req`, returns its correlation id.
    pub async fn send<R: Request>(&mut self, req: &R, version: i16) -> i32 {
        let id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let body = Self::encode_request(req, version, id);
        self.write_frame(&body).await.expect("write request");
        id
    }

    /// Reads one response frame (without the size prefix).
    pub async fn read_frame(&mut self) -> std::io::Result<Bytes> {
        let read = async {
            let size = self.stream.read_i32().await?;
            let mut body = vec![0u8; size as usize];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(Bytes::from(body))
        };
        tokio::time::timeout(RAW_TIMEOUT, read)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no response")))
    }

    /// Sends `req` at `version` and decodes the response, checking the correlation id.
    pub async fn call<R: Request>(&mut self, req: &R, version: i16) -> R::Response {
        let api_key = ApiKey::try_from(R::KEY).expect("known key");
        let id = self.send(req, version).await;
        let mut frame = self.read_frame().await.unwrap_or_else(|e| panic!("{api_key:?} v{version}: no response: {e}"));
        let header =
            ResponseHeader::decode(&mut frame, api_key.response_header_version(version)).expect("response header");
        assert_eq!(header.correlation_id, id, "correlation id");
        let resp = R::Response::decode(&mut frame, version).expect("response body decodes");
        assert_eq!(frame.remaining(), 0, "{api_key:?} v{version} response has trailing bytes");
        resp
    }

    /// Waits (bounded) for the broker to close the connection: EOF or reset,
    /// with no response bytes before it. Panics if data arrives or nothing happens.
    pub async fn expect_closed(&mut self, what: &str) {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(RAW_TIMEOUT, self.stream.read(&mut buf)).await {
            Err(_) => {
                panic!("{what}: the broker did not close the connection within {RAW_TIMEOUT:?}")
            }
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => panic!("{what}: expected the connection to close, got {n} bytes: {:?}", &buf[..n]),
            Ok(Err(e)) => assert!(
                matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
                "{what}: unexpected read error {e}"
            ),
        }
    }
}

/// Creates `topic` with `partitions` partitions and topic `configs` through the AdminClient.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = admin_config(bootstrap).create().expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics([&new], &opts).await.expect("CreateTopics request");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e:?}"));
    }
}

/// Produces one record (acks=all) with a fresh producer; returns (partition, offset).
pub async fn produce_one(bootstrap: &str, topic: &str, partition: i32, value: &[u8]) -> (i32, i64) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = producer_config(bootstrap).create().expect("producer");
    let record = FutureRecord::<(), [u8]>::to(topic).partition(partition).payload(value);
    let d = producer
        .send(record, Duration::from_secs(20))
        .await
        .unwrap_or_else(|(e, _)| panic!("produce to {topic}-{partition}: {e}"));
    (d.partition, d.offset)
}

/// Reads `count` records of `topic`-`partition` from `from` with a fresh
/// assigned consumer (check.crcs=true). Any consumer error fails the test.
/// Returns (offset, value) pairs in order. Stops early at end of partition
/// once `count` is reached or `timeout` passes (then panics).
pub async fn consume(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    from: i64,
    count: usize,
    timeout: Duration,
) -> Vec<(i64, Vec<u8>)> {
    let config = consumer_config(bootstrap);
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || consume_blocking(config, &topic, partition, from, count, timeout))
        .await
        .expect("consumer thread")
}

pub fn consume_blocking(
    config: ClientConfig,
    topic: &str,
    partition: i32,
    from: i64,
    count: usize,
    timeout: Duration,
) -> Vec<(i64, Vec<u8>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from)).expect("tpl");
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "consumed {} of {count} records of {topic}-{partition} from {from} within {timeout:?}",
            out.len()
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => out.push((m.offset(), m.payload().unwrap_or_default().to_vec())),
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::PartitionEOF))) => {}
            Some(Err(e)) => panic!("consumer error on {topic}-{partition} after {} records: {e}", out.len()),
        }
    }
    out
}

/// (low, high) watermarks of `topic`-`partition` via ListOffsets.
pub async fn watermarks(bootstrap: &str, topic: &str, partition: i32) -> (i64, i64) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let config = consumer_config(bootstrap);
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().expect("consumer");
        consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10)).expect("fetch_watermarks")
    })
    .await
    .expect("watermarks thread")
}
