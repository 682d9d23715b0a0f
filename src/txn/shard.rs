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
    /// Transactions whose markers are being written by a background task,
    /// with the EndTxn replies waiting for the outcome. The shard keeps
    /// answering other requests meanwhile (a partition without a leader can
    /// hold markers for seconds).
    completing: HashMap<String, Vec<oneshot::Sender<i16>>>,
    marked_tx: mpsc::UnboundedSender<Marked>,
    marked_rx: Option<mpsc::UnboundedReceiver<Marked>>,
}

/// The outcome of one transaction's markers, reported to its shard.
struct Marked {
    id: String,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    written: bool,
}

impl Shard {
    pub fn new(
        partition: Arc<Partition>,
        markers: super::MarkerWriter,
        open: Arc<OpenTransactions>,
        settings: TxnSettings,
        loaded: Arc<AtomicBool>,
    ) -> Self {
        let (marked_tx, marked_rx) = mpsc::unbounded_channel();
        Shard {
            partition,
            replicas: markers.replicas.clone(),
            markers,
            open,
            settings,
            loaded,
            txns: HashMap::new(),
            completing: HashMap::new(),
            marked_tx,
            marked_rx: Some(marked_rx),
        }
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
                TxnState::PrepareCommit => self.start_completion(&id, true, None),
                TxnState::PrepareAbort | TxnState::PrepareEpochFence => self.start_completion(&id, false, None),
                TxnState::Ongoing => {
                    self.open.set(meta.producer_id, meta.epoch, meta.partitions.iter().cloned().collect())
                }
                _ => {}
            }
        }
        self.loaded.store(true, Ordering::Release);
        let mut marked_rx = self.marked_rx.take().expect("run once");
        let mut tick = tokio::time::interval(Duration::from_millis(self.settings.abort_check_interval_ms.max(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd).await,
                    None => break,
                },
                Some(marked) = marked_rx.recv() => self.finish_completion(marked).await,
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
                let r = self.add_partitions(&id, producer_id, epoch, partitions, verify_only).await;
                let _ = reply.send(r);
            }
            Command::EndTxn { id, producer_id, epoch, commit, reply } => {
                self.end_txn(&id, producer_id, epoch, commit, reply).await;
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
    async fn persist(&self, id: &str, meta: &TxnMeta) -> Result<(), i16> {
        self.write(id, Some(records::encode_value(&meta.value()))).await
    }

    /// Appends one record for `id` (`None`: a tombstone) and waits until
    /// the in-sync replicas have it, so nothing is acted on (markers
    /// written, a client answered) that a new leader could lack. Refused
    /// before appending when the ISR is below min ISR.
    async fn write(&self, id: &str, value: Option<Bytes>) -> Result<(), i16> {
        if let Some((isr, required)) = self.partition.under_min_isr() {
            tracing::warn!(partition = self.partition.index, isr, required, "__transaction_state below min ISR");
            return Err(code(ResponseError::CoordinatorNotAvailable));
        }
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
            value,
            headers: Default::default(),
        };
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buf, [record].iter(), &options)
            .map_err(|_| code(ResponseError::UnknownServerError))?;
        let result = match self.partition.append_at_epoch(&buf, AppendOrigin::Coordinator, now_ms()) {
            Ok((info, epoch)) => {
                let deadline = tokio::time::Instant::now() + crate::shard::REPLICATION_TIMEOUT;
                self.partition.wait_replicated(info.last_offset, epoch, deadline).await
            }
            Err(e) => Err(e),
        };
        result.map_err(|e| {
            tracing::error!(partition = self.partition.index, error = %e, "cannot write to __transaction_state");
            crate::api::error::coordinator_write_code(&e)
        })
    }

    /// Moves `id` to `meta` durably, then in memory.
    async fn transition(&mut self, id: &str, meta: TxnMeta) -> Result<(), i16> {
        self.persist(id, &meta).await?;
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
            return match self.transition(id, meta).await {
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
            if let Err(e) = self.transition(id, meta.clone()).await {
                return (e, -1, -1);
            }
            // As Kafka: the abort markers are written in the background and
            // the producer retries until the old transaction is complete,
            // so the shard never waits on a partition without a leader (and
            // a transaction whose marker cannot be written stays prepared,
            // to be completed once its partitions are led again, never left
            // open with its last stable offset stuck).
            self.start_completion(id, false, None);
            return (code(ResponseError::ConcurrentTransactions), -1, -1);
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
        match self.transition(id, meta).await {
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

    async fn add_partitions(
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
        match self.transition(id, meta).await {
            Ok(()) => {
                self.open.set(producer_id, epoch, registered);
                all(0)
            }
            Err(e) => all(e),
        }
    }

    /// Answers `reply` once the transaction is complete (its markers
    /// written), or with the error that stopped it.
    async fn end_txn(&mut self, id: &str, producer_id: i64, epoch: i16, commit: bool, reply: oneshot::Sender<i16>) {
        match self.prepare_end(id, producer_id, epoch, commit).await {
            Ok(true) => self.start_completion(id, commit, Some(reply)),
            Ok(false) => {
                let _ = reply.send(0);
            }
            Err(e) => {
                let _ = reply.send(e);
            }
        }
    }

    /// The first phase of EndTxn: Ok(true) once Prepare* is written,
    /// Ok(false) when there is nothing left to do.
    async fn prepare_end(&mut self, id: &str, producer_id: i64, epoch: i16, commit: bool) -> Result<bool, i16> {
        let mut meta = self.check_producer(id, producer_id, epoch)?;
        match (meta.state, commit) {
            (TxnState::Ongoing, _) => {}
            // A retried EndTxn whose first attempt completed.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => return Ok(false),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                return Err(code(ResponseError::ConcurrentTransactions))
            }
            // Aborting with nothing open is harmless (clients abort after errors).
            (TxnState::Empty, false) => return Ok(false),
            _ => return Err(code(ResponseError::InvalidTxnState)),
        }
        meta.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
        meta.last_update_ms = now_ms();
        self.transition(id, meta).await?;
        Ok(true)
    }

    /// Second phase, in the background: a task writes the markers and
    /// reports to [`Self::finish_completion`]; `reply` (an EndTxn) waits
    /// for it. At most one task per transaction.
    fn start_completion(&mut self, id: &str, commit: bool, reply: Option<oneshot::Sender<i16>>) {
        let Some(meta) = self.txns.get(id) else {
            if let Some(reply) = reply {
                let _ = reply.send(code(ResponseError::InvalidTxnState));
            }
            return;
        };
        if let Some(waiting) = self.completing.get_mut(id) {
            waiting.extend(reply);
            return;
        }
        self.completing.insert(id.to_string(), reply.into_iter().collect());
        let partitions: Vec<(String, i32)> = meta.partitions.iter().cloned().collect();
        let (producer_id, epoch) = (meta.producer_id, meta.epoch);
        let coordinator_epoch = self.coordinator_epoch();
        let markers = self.markers.clone();
        let report = self.marked_tx.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let marked = markers.write_all(&partitions, producer_id, epoch, commit, coordinator_epoch).await;
            log_unmarked(&id, &marked);
            let _ = report.send(Marked { id, producer_id, epoch, commit, written: marked.is_ok() });
        });
    }

    /// Moves a marked transaction to Complete and answers its waiters. A
    /// transaction whose markers were not all written stays in Prepare*:
    /// the shard's periodic check (or the next load) completes it, and its
    /// client's retried EndTxn meets CONCURRENT_TRANSACTIONS until then.
    async fn finish_completion(&mut self, marked: Marked) {
        let waiting = self.completing.remove(&marked.id).unwrap_or_default();
        let result = if marked.written { self.mark_complete(&marked).await } else { Err(()) };
        let answer = match result {
            Ok(()) => 0,
            Err(()) => code(ResponseError::CoordinatorNotAvailable),
        };
        for reply in waiting {
            let _ = reply.send(answer);
        }
    }

    async fn mark_complete(&mut self, marked: &Marked) -> Result<(), ()> {
        let Some(meta) = self.txns.get(&marked.id) else { return Err(()) };
        let prepared = if marked.commit {
            meta.state == TxnState::PrepareCommit
        } else {
            matches!(meta.state, TxnState::PrepareAbort | TxnState::PrepareEpochFence)
        };
        if !prepared || meta.producer_id != marked.producer_id || meta.epoch != marked.epoch {
            return Err(());
        }
        let mut done = meta.clone();
        done.state = if marked.commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
        done.last_update_ms = now_ms();
        // As in Kafka, a completed transaction holds no partitions.
        done.partitions.clear();
        let (pid, epoch) = (done.producer_id, done.epoch);
        self.transition(&marked.id, done).await.map_err(|_| ())?;
        self.open.close(pid, epoch);
        Ok(())
    }

    /// Completes transactions left in Prepare* because a marker could not be
    /// written (a partition without a leader until its broker returned):
    /// retried once every partition has a leader again, so a long outage
    /// does not hold the shard in marker retries on every tick.
    async fn finish_prepared(&mut self) {
        let stuck: Vec<(String, bool)> = self
            .txns
            .iter()
            .filter(|(id, m)| !self.completing.contains_key(*id) && self.all_partitions_led(m))
            .filter_map(|(id, m)| match m.state {
                TxnState::PrepareCommit => Some((id.clone(), true)),
                TxnState::PrepareAbort | TxnState::PrepareEpochFence => Some((id.clone(), false)),
                _ => None,
            })
            .collect();
        for (id, commit) in stuck {
            tracing::info!(transactional_id = %id, commit, "completing a transaction whose markers were not all written");
            self.start_completion(&id, commit, None);
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
            if self.transition(&id, meta).await.is_ok() {
                self.start_completion(&id, false, None);
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
            if self.tombstone(&id).await.is_ok() {
                if let Some(m) = self.txns.remove(&id) {
                    self.open.forget(m.producer_id);
                }
            }
        }
    }

    async fn tombstone(&self, id: &str) -> Result<(), i16> {
        self.write(id, None).await
    }
}

fn log_unmarked(id: &str, marked: &Result<(), super::Unmarked>) {
    if let Err(failed) = marked {
        for ((topic, partition), e) in failed {
            tracing::error!(transactional_id = id, topic, partition, error = e, "transaction marker failed");
        }
    }
}

/// Replays one `__transaction_state` partition: the latest value per id.
fn load(partition: &Partition) -> Result<HashMap<String, TxnMeta>, String> {
    let mut txns = HashMap::new();
    let offsets = partition.offsets().map_err(|e| e.to_string())?;
    let mut position = offsets.log_start_offset;
    let mut buf = Vec::new();
    while position < offsets.log_end_offset {
        let info = partition.read_to_log_end(position, 4 << 20).map_err(|e| e.to_string())?;
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
