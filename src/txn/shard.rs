//! One transaction coordinator shard: the transactional ids of one
//! `__transaction_state` partition, owned by a single task.
//!
//! Commit and abort follow Kafka's two phases: the Prepare state is written
//! first, then the markers, then the Complete state. A crash between them
//! leaves Prepare in the log, and loading finishes the job.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strand_storage::batch;
use strand_storage::AppendOrigin;
use tokio::sync::{mpsc, oneshot, watch};

use super::records::{self, TxnState, TxnValue};
use super::{DescribedTxn, ListedTxn, OpenTransactions, TxnSettings};
use crate::replica::{Partition, ReplicaManager};
use crate::util::now_ms;

/// Markers are written at this coordinator epoch: one coordinator, never moved.
const COORDINATOR_EPOCH: i32 = 0;

pub enum Command {
    InitProducerId {
        id: String,
        timeout_ms: i32,
        producer_id: i64,
        epoch: i16,
        reply: oneshot::Sender<(i16, i64, i16)>,
    },
    AddPartitions {
        id: String,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<(String, i32)>,
        verify_only: bool,
        reply: oneshot::Sender<Vec<(String, i32, i16)>>,
    },
    EndTxn {
        id: String,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        reply: oneshot::Sender<i16>,
    },
    Describe(String, oneshot::Sender<DescribedTxn>),
    List(oneshot::Sender<Vec<ListedTxn>>),
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

#[derive(Debug, Clone)]
struct TxnMeta {
    producer_id: i64,
    epoch: i16,
    timeout_ms: i32,
    state: TxnState,
    partitions: BTreeSet<(String, i32)>,
    start_ms: i64,
    last_update_ms: i64,
}

impl TxnMeta {
    fn value(&self) -> TxnValue {
        let mut by_topic: Vec<(String, Vec<i32>)> = Vec::new();
        for (t, p) in &self.partitions {
            match by_topic.last_mut() {
                Some((last, ps)) if last == t => ps.push(*p),
                _ => by_topic.push((t.clone(), vec![*p])),
            }
        }
        TxnValue {
            producer_id: self.producer_id,
            producer_epoch: self.epoch,
            timeout_ms: self.timeout_ms,
            state: self.state,
            partitions: by_topic,
            last_update_ms: self.last_update_ms,
            start_ms: self.start_ms,
        }
    }
}

pub struct Shard {
    partition: Arc<Partition>,
    replicas: Arc<ReplicaManager>,
    markers: super::MarkerWriter,
    open: Arc<OpenTransactions>,
    settings: TxnSettings,
    loaded: Arc<AtomicBool>,
    txns: HashMap<String, TxnMeta>,
}

impl Shard {
    pub fn new(
        partition: Arc<Partition>,
        markers: super::MarkerWriter,
        open: Arc<OpenTransactions>,
        settings: TxnSettings,
        loaded: Arc<AtomicBool>,
    ) -> Self {
        Shard { partition, replicas: markers.replicas.clone(), markers, open, settings, loaded, txns: HashMap::new() }
    }

    /// The epoch markers are written at: this shard's partition's leader
    /// epoch in a cluster (it grows whenever coordination moves), the fixed
    /// single-node epoch otherwise.
    fn coordinator_epoch(&self) -> i32 {
        match self.markers.cluster.as_ref().map(|c| c.leadership(super::TXN_TOPIC, self.partition.index)) {
            Some(crate::cluster::Leadership::Here { leader_epoch }) => leader_epoch.max(COORDINATOR_EPOCH),
            _ => COORDINATOR_EPOCH,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut shutdown: watch::Receiver<bool>) {
        let partition = self.partition.clone();
        match tokio::task::spawn_blocking(move || load(&partition)).await {
            Ok(Ok(txns)) => self.txns = txns,
            Ok(Err(e)) => {
                tracing::error!(partition = self.partition.index, error = %e, "cannot load __transaction_state partition");
                return;
            }
            Err(e) => {
                tracing::error!(partition = self.partition.index, error = %e, "transaction state load panicked");
                return;
            }
        }
        // Finish what the previous run was completing; register open transactions.
        let ids: Vec<String> = self.txns.keys().cloned().collect();
        for id in ids {
            let meta = self.txns[&id].clone();
            match meta.state {
                TxnState::PrepareCommit => self.complete(&id, true).await,
                TxnState::PrepareAbort | TxnState::PrepareEpochFence => self.complete(&id, false).await,
                TxnState::Ongoing => {
                    self.open.set(meta.producer_id, meta.epoch, meta.partitions.iter().cloned().collect())
                }
                _ => {}
            }
        }
        self.loaded.store(true, Ordering::Release);
        let mut tick = tokio::time::interval(Duration::from_millis(self.settings.abort_check_interval_ms.max(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd).await,
                    None => break,
                },
                _ = tick.tick() => {
                    self.abort_timed_out().await;
                    self.finish_prepared().await;
                }
                _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            }
        }
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::InitProducerId { id, timeout_ms, producer_id, epoch, reply } => {
                let r = self.init_producer_id(&id, timeout_ms, producer_id, epoch).await;
                let _ = reply.send(r);
            }
            Command::AddPartitions { id, producer_id, epoch, partitions, verify_only, reply } => {
                let r = self.add_partitions(&id, producer_id, epoch, partitions, verify_only);
                let _ = reply.send(r);
            }
            Command::EndTxn { id, producer_id, epoch, commit, reply } => {
                let r = self.end_txn(&id, producer_id, epoch, commit).await;
                let _ = reply.send(r);
            }
            Command::Describe(id, reply) => {
                let _ = reply.send(match self.txns.get(&id) {
                    Some(m) => DescribedTxn {
                        error: 0,
                        transactional_id: id,
                        state: m.state.name().to_string(),
                        timeout_ms: m.timeout_ms,
                        // Kept after completion, as Kafka reports it.
                        start_ms: m.start_ms,
                        producer_id: m.producer_id,
                        producer_epoch: m.epoch,
                        partitions: m.value().partitions,
                    },
                    None => DescribedTxn {
                        error: code(ResponseError::TransactionalIdNotFound),
                        transactional_id: id,
                        state: String::new(),
                        timeout_ms: 0,
                        start_ms: -1,
                        producer_id: -1,
                        producer_epoch: -1,
                        partitions: Vec::new(),
                    },
                });
            }
            Command::List(reply) => {
                let _ = reply.send(
                    self.txns
                        .iter()
                        .map(|(id, m)| ListedTxn {
                            transactional_id: id.clone(),
                            producer_id: m.producer_id,
                            state: m.state.name().to_string(),
                            start_ms: if m.state == TxnState::Ongoing { m.start_ms } else { -1 },
                        })
                        .collect(),
                );
            }
        }
    }

    /// Persists `meta` for `id` to `__transaction_state`.
    fn persist(&self, id: &str, meta: &TxnMeta) -> Result<(), i16> {
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: now_ms(),
            key: Some(records::encode_key(id)),
            value: Some(records::encode_value(&meta.value())),
            headers: Default::default(),
        };
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buf, [record].iter(), &options)
            .map_err(|_| code(ResponseError::UnknownServerError))?;
        self.partition.append(&buf, AppendOrigin::Coordinator, now_ms()).map(|_| ()).map_err(|e| {
            tracing::error!(partition = self.partition.index, error = %e, "cannot append to __transaction_state");
            code(ResponseError::CoordinatorNotAvailable)
        })
    }

    /// Moves `id` to `meta` durably, then in memory.
    fn transition(&mut self, id: &str, meta: TxnMeta) -> Result<(), i16> {
        self.persist(id, &meta)?;
        self.txns.insert(id.to_string(), meta);
        Ok(())
    }

    async fn init_producer_id(&mut self, id: &str, timeout_ms: i32, producer_id: i64, epoch: i16) -> (i16, i64, i16) {
        if id.is_empty() {
            return (code(ResponseError::InvalidRequest), -1, -1);
        }
        if timeout_ms <= 0 || timeout_ms > self.settings.max_timeout_ms {
            return (code(ResponseError::InvalidTransactionTimeout), -1, -1);
        }
        let now = now_ms();
        let Some(mut meta) = self.txns.get(id).cloned() else {
            let pid = match self.markers.allocate_producer_id().await {
                Ok(p) => p,
                Err(_) => return (code(ResponseError::CoordinatorNotAvailable), -1, -1),
            };
            let meta = TxnMeta {
                producer_id: pid,
                epoch: 0,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                last_update_ms: now,
            };
            return match self.transition(id, meta) {
                Ok(()) => (0, pid, 0),
                Err(e) => (e, -1, -1),
            };
        };
        // KIP-360: a producer re-initialising with its id and epoch must present the current ones.
        if producer_id >= 0 && (producer_id != meta.producer_id || epoch != meta.epoch) {
            return (code(ResponseError::ProducerFenced), -1, -1);
        }
        if matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence) {
            return (code(ResponseError::ConcurrentTransactions), -1, -1);
        }
        if meta.state == TxnState::Ongoing {
            // Fence the previous incarnation: its transaction is aborted at a bumped
            // epoch, so its late writes and its own EndTxn are refused.
            meta.epoch = meta.epoch.saturating_add(1);
            meta.state = TxnState::PrepareEpochFence;
            meta.last_update_ms = now;
            if let Err(e) = self.transition(id, meta.clone()) {
                return (e, -1, -1);
            }
            self.complete(id, false).await;
            meta = self.txns[id].clone();
        }
        // The new incarnation gets a fresh epoch; a new producer id when epochs run out.
        if meta.epoch >= i16::MAX - 2 {
            match self.markers.allocate_producer_id().await {
                Ok(p) => {
                    meta.producer_id = p;
                    meta.epoch = 0;
                }
                Err(_) => return (code(ResponseError::CoordinatorNotAvailable), -1, -1),
            }
        } else {
            meta.epoch += 1;
        }
        meta.timeout_ms = timeout_ms;
        meta.state = TxnState::Empty;
        meta.partitions.clear();
        meta.start_ms = -1;
        meta.last_update_ms = now;
        let (pid, ep) = (meta.producer_id, meta.epoch);
        match self.transition(id, meta) {
            Ok(()) => {
                self.open.close(pid, ep);
                (0, pid, ep)
            }
            Err(e) => (e, -1, -1),
        }
    }

    /// The checks every request of a producer's transaction passes first.
    fn check_producer(&self, id: &str, producer_id: i64, epoch: i16) -> Result<TxnMeta, i16> {
        let meta = self.txns.get(id).ok_or(code(ResponseError::InvalidProducerIdMapping))?;
        if meta.producer_id != producer_id {
            return Err(code(ResponseError::InvalidProducerIdMapping));
        }
        if epoch != meta.epoch {
            return Err(code(ResponseError::ProducerFenced));
        }
        Ok(meta.clone())
    }

    fn add_partitions(
        &mut self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<(String, i32)>,
        verify_only: bool,
    ) -> Vec<(String, i32, i16)> {
        let all = |c: i16| partitions.iter().map(|(t, p)| (t.clone(), *p, c)).collect::<Vec<_>>();
        let mut meta = match self.check_producer(id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return all(e),
        };
        if verify_only {
            // KIP-890: a broker asking whether the partitions are in the transaction.
            return partitions
                .iter()
                .map(|(t, p)| {
                    let ok = meta.state == TxnState::Ongoing && meta.partitions.contains(&(t.clone(), *p));
                    (t.clone(), *p, if ok { 0 } else { code(ResponseError::InvalidTxnState) })
                })
                .collect();
        }
        if matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence) {
            return all(code(ResponseError::ConcurrentTransactions));
        }
        let unknown: HashSet<(String, i32)> =
            partitions.iter().filter(|(t, p)| !self.replicas.partition_exists(t, *p)).cloned().collect();
        if !unknown.is_empty() {
            return partitions
                .iter()
                .map(|(t, p)| {
                    let c = if unknown.contains(&(t.clone(), *p)) {
                        code(ResponseError::UnknownTopicOrPartition)
                    } else {
                        code(ResponseError::OperationNotAttempted)
                    };
                    (t.clone(), *p, c)
                })
                .collect();
        }
        let now = now_ms();
        if meta.state != TxnState::Ongoing {
            meta.start_ms = now;
            meta.partitions.clear();
        }
        meta.state = TxnState::Ongoing;
        meta.partitions.extend(partitions.iter().cloned());
        meta.last_update_ms = now;
        let registered: HashSet<(String, i32)> = meta.partitions.iter().cloned().collect();
        match self.transition(id, meta) {
            Ok(()) => {
                self.open.set(producer_id, epoch, registered);
                all(0)
            }
            Err(e) => all(e),
        }
    }

    async fn end_txn(&mut self, id: &str, producer_id: i64, epoch: i16, commit: bool) -> i16 {
        let mut meta = match self.check_producer(id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return e,
        };
        match (meta.state, commit) {
            (TxnState::Ongoing, _) => {}
            // A retried EndTxn whose first attempt completed.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => return 0,
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                return code(ResponseError::ConcurrentTransactions)
            }
            // Aborting with nothing open is harmless (clients abort after errors).
            (TxnState::Empty, false) => return 0,
            _ => return code(ResponseError::InvalidTxnState),
        }
        meta.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
        meta.last_update_ms = now_ms();
        if let Err(e) = self.transition(id, meta) {
            return e;
        }
        self.complete(id, commit).await;
        match self.txns.get(id).map(|m| m.state) {
            Some(TxnState::CompleteCommit) | Some(TxnState::CompleteAbort) => 0,
            _ => code(ResponseError::CoordinatorNotAvailable),
        }
    }

    /// Second phase: markers to every partition, then the Complete state.
    async fn complete(&mut self, id: &str, commit: bool) {
        let Some(meta) = self.txns.get(id).cloned() else { return };
        let partitions: Vec<(String, i32)> = meta.partitions.iter().cloned().collect();
        let coordinator_epoch = self.coordinator_epoch();
        let marked = self.markers.write_all(&partitions, meta.producer_id, meta.epoch, commit, coordinator_epoch).await;
        if let Err(failed) = marked {
            for ((topic, partition), e) in failed {
                tracing::error!(transactional_id = id, topic, partition, error = e, "transaction marker failed");
            }
            // Stays in Prepare*: the shard's periodic check (or the next
            // load) completes it.
            return;
        }
        let mut done = meta;
        done.state = if commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
        done.last_update_ms = now_ms();
        // As in Kafka, a completed transaction holds no partitions.
        done.partitions.clear();
        let (pid, epoch) = (done.producer_id, done.epoch);
        if self.transition(id, done).is_ok() {
            self.open.close(pid, epoch);
        }
    }

    /// Completes transactions left in Prepare* because a marker could not be
    /// written (a partition without a leader until its broker returned):
    /// retried once every partition has a leader again, so a long outage
    /// does not hold the shard in marker retries on every tick.
    async fn finish_prepared(&mut self) {
        let stuck: Vec<(String, bool)> = self
            .txns
            .iter()
            .filter(|(_, m)| self.all_partitions_led(m))
            .filter_map(|(id, m)| match m.state {
                TxnState::PrepareCommit => Some((id.clone(), true)),
                TxnState::PrepareAbort | TxnState::PrepareEpochFence => Some((id.clone(), false)),
                _ => None,
            })
            .collect();
        for (id, commit) in stuck {
            tracing::info!(transactional_id = %id, commit, "completing a transaction whose markers were not all written");
            self.complete(&id, commit).await;
        }
    }

    fn all_partitions_led(&self, meta: &TxnMeta) -> bool {
        let Some(cluster) = &self.markers.cluster else { return true };
        meta.partitions.iter().all(|(topic, p)| {
            !matches!(cluster.leadership(topic, *p), crate::cluster::Leadership::Elsewhere { leader, .. } if leader < 0)
        })
    }

    /// Aborts transactions open longer than their timeout, fencing the producer.
    async fn abort_timed_out(&mut self) {
        let now = now_ms();
        let expired: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| m.state == TxnState::Ongoing && now.saturating_sub(m.start_ms) > m.timeout_ms as i64)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            let mut meta = self.txns[&id].clone();
            tracing::info!(transactional_id = %id, producer_id = meta.producer_id, "transaction timed out: aborting");
            meta.epoch = meta.epoch.saturating_add(1);
            meta.state = TxnState::PrepareAbort;
            meta.last_update_ms = now;
            if self.transition(&id, meta).is_ok() {
                self.complete(&id, false).await;
            }
        }
        // Forget idle transactional ids (transactional.id.expiration.ms).
        let stale: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                matches!(m.state, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)
                    && now.saturating_sub(m.last_update_ms) > self.settings.id_expiration_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if self.tombstone(&id).is_ok() {
                if let Some(m) = self.txns.remove(&id) {
                    self.open.forget(m.producer_id);
                }
            }
        }
    }

    fn tombstone(&self, id: &str) -> Result<(), i16> {
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: now_ms(),
            key: Some(records::encode_key(id)),
            value: None,
            headers: Default::default(),
        };
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buf, [record].iter(), &options)
            .map_err(|_| code(ResponseError::UnknownServerError))?;
        self.partition
            .append(&buf, AppendOrigin::Coordinator, now_ms())
            .map(|_| ())
            .map_err(|_| code(ResponseError::CoordinatorNotAvailable))
    }
}

/// Replays one `__transaction_state` partition: the latest value per id.
fn load(partition: &Partition) -> Result<HashMap<String, TxnMeta>, String> {
    let mut txns = HashMap::new();
    let offsets = partition.offsets().map_err(|e| e.to_string())?;
    let mut position = offsets.log_start_offset;
    let mut buf = Vec::new();
    while position < offsets.high_watermark {
        let (info, _, _) = partition.read(position, 4 << 20, false, true).map_err(|e| e.to_string())?;
        if info.slices.is_empty() {
            break;
        }
        buf.clear();
        for s in &info.slices {
            s.read_into(&mut buf).map_err(|e| e.to_string())?;
        }
        for (at, header, total) in batch::iter(&buf) {
            position = header.last_offset() + 1;
            if header.is_control() {
                continue;
            }
            let mut bytes = Bytes::copy_from_slice(&buf[at..at + total]);
            let set = RecordBatchDecoder::decode(&mut bytes).map_err(|e| format!("undecodable batch: {e}"))?;
            for r in set.records {
                let Some(id) = r.key.as_deref().and_then(records::decode_key) else { continue };
                match r.value.as_deref() {
                    None => {
                        txns.remove(&id);
                    }
                    Some(v) => match records::decode_value(v) {
                        Some(v) => {
                            txns.insert(
                                id,
                                TxnMeta {
                                    producer_id: v.producer_id,
                                    epoch: v.producer_epoch,
                                    timeout_ms: v.timeout_ms,
                                    state: v.state,
                                    partitions: v
                                        .partitions
                                        .iter()
                                        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
                                        .collect(),
                                    start_ms: v.start_ms,
                                    last_update_ms: v.last_update_ms,
                                },
                            );
                        }
                        None => tracing::warn!(transactional_id = %id, "skipping unreadable transaction state"),
                    },
                }
            }
        }
    }
    Ok(txns)
}
