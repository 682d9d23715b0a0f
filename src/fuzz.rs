//! Entry points of the fuzz targets (`fuzz/`, run with cargo fuzz) and of
//! their corpus regression test (`tests/fuzz_corpus.rs`). Each takes
//! arbitrary bytes and does with them what the broker does with such bytes
//! from outside: a request frame from a client, a produced record batch, a
//! `server.properties`, a frame on a controller connection, a metadata or
//! coordinator record read back from disk. None may panic, hang or allocate
//! without bound; errors are the expected answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strand_storage::batch::{self, AppendOrigin};

use crate::broker::{Broker, BrokerHandle, BrokerState};
use crate::config::BrokerConfig;

/// Record batches as a producer sends them: validated as they come (most
/// fail the CRC), then again with every framed batch's CRC-32C made right,
/// so the record checks and decompression behind the CRC are reached too.
pub fn record_batches(data: &[u8]) {
    let _ = batch::validate_all(data, AppendOrigin::Client);
    let _ = batch::validate_all(data, AppendOrigin::Coordinator);
    let mut fixed = data.to_vec();
    let mut position = 0usize;
    // base offset (8) + length (4) + leader epoch (4) + magic (1) + crc (4).
    while position + 21 <= fixed.len() {
        let length = i32::from_be_bytes(fixed[position + 8..position + 12].try_into().unwrap_or_default());
        let Some(end) = usize::try_from(length).ok().and_then(|l| (position + 12).checked_add(l)) else { break };
        if length < 9 || end > fixed.len() {
            break;
        }
        let crc = crc32c::crc32c(&fixed[position + 21..end]);
        fixed[position + 17..position + 21].copy_from_slice(&crc.to_be_bytes());
        position = end;
    }
    if batch::validate_all(&fixed, AppendOrigin::Client).is_ok() {
        let _ = batch::all_records_have_keys(&fixed);
        for (at, _, _) in batch::iter(&fixed) {
            let _ = batch::parse_end_txn_marker(&fixed, at);
        }
    }
}

/// A `server.properties` (as UTF-8, lossily) with no overrides.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = BrokerConfig::from_properties(&text, "fuzz", &[]);
}

/// One frame body on a controller connection, read as each of the things
/// a frame there can be: the handshake, a raft message, a broker's request
/// to the controller; and the metadata log's record batches and snapshots.
pub fn controller_frame(data: &[u8]) {
    use protobuf::Message as _;
    let _ = serde_json::from_slice::<crate::controller::transport::Hello>(data);
    let _ = raft::eraftpb::Message::parse_from_bytes(data);
    let _ = serde_json::from_slice::<crate::controller::core::Request>(data);
    let _ = crate::metadata::records::RecordBatch::decode(0, data);
    let _ = crate::metadata::image::ClusterImage::decode(data);
}

/// Keys and values of `__transaction_state` and `__consumer_offsets`
/// records, as the coordinators read them back when loading.
pub fn coordinator_records(data: &[u8]) {
    let _ = crate::txn::records::decode_key(data);
    let _ = crate::txn::records::decode_value(data);
    let _ = crate::group::records::decode_key(data);
    let _ = crate::group::records::decode_offset_value(data);
    let _ = crate::group::records::decode_group_value(data);
}

/// A running single-node broker (its own runtime, data in a fresh
/// directory under the system's temporary directory) that request frames
/// are handed to as a connection hands them.
pub struct RequestTarget {
    runtime: tokio::runtime::Runtime,
    broker: Option<BrokerHandle>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    dir: std::path::PathBuf,
}

/// How long one request is given. A request may rightly wait longer (a
/// fetch's max wait, a join's rebalance timeout, both the client's to
/// choose): it is then dropped, as a closed connection drops it.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);

impl RequestTarget {
    pub fn new() -> RequestTarget {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let dir = std::env::temp_dir().join(format!("strand-fuzz-{}-{unique}", std::process::id()));
        let text = format!(
            "node.id=1\nlisteners=PLAINTEXT://127.0.0.1:0\nlog.dirs={}\nnum.partitions=2\n",
            dir.join("data").display()
        );
        let config = BrokerConfig::from_properties(&text, "fuzz", &[]).expect("fuzz broker config");
        let broker = runtime.block_on(Broker::start(config)).expect("fuzz broker starts");
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        // Leaked on purpose: a closed sender would read as "shutting down".
        std::mem::forget(_tx);
        RequestTarget { runtime, broker: Some(broker), shutdown, dir }
    }

    fn state(&self) -> &Arc<BrokerState> {
        self.broker.as_ref().expect("running").state()
    }

    /// Handles `frame` (a request without its size prefix) to the end,
    /// including a response that comes later, for at most [`REQUEST_LIMIT`].
    pub fn request(&self, frame: &[u8]) {
        let state = self.state().clone();
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
        let frame = Bytes::copy_from_slice(frame);
        let shutdown = self.shutdown.clone();
        self.runtime.block_on(async move {
            let _ = tokio::time::timeout(REQUEST_LIMIT, async {
                let mut outcome = crate::api::handle(&state, "PLAINTEXT", peer, frame, &shutdown).await;
                while let crate::api::Outcome::Deferred(later) = outcome {
                    outcome = later.await;
                }
            })
            .await;
        });
    }
}

impl Default for RequestTarget {
    fn default() -> Self {
        RequestTarget::new()
    }
}

impl Drop for RequestTarget {
    fn drop(&mut self) {
        if let Some(broker) = self.broker.take() {
            self.runtime.block_on(broker.shutdown());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
