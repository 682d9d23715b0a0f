//! The Ready-contract core of the metadata quorum: one `raft::RawNode`
//! driven by the caller, writing through [`RaftLogStore`].
//!
//! [`QuorumNode`] does no network I/O and keeps no clock. The caller:
//!
//! 1. calls [`QuorumNode::tick`] every tick interval (e.g. 50 ms),
//! 2. feeds received messages to [`QuorumNode::step`],
//! 3. proposes with [`QuorumNode::propose`] (leader only: a follower answers
//!    [`ProposeError::NotLeader`] naming the leader it knows; proposals are
//!    never forwarded, and a dropped proposal is not retried here: retrying,
//!    or answering the client, is the caller's job),
//! 4. after any of the above calls [`QuorumNode::handle_ready`] and then,
//!    in this order: loads [`ReadyOutput::snapshot`] if any, applies
//!    [`ReadyOutput::committed`] (see [`is_app_data`]), sends
//!    [`ReadyOutput::messages`], and reports the applied index with
//!    [`QuorumNode::advance_applied`].
//!
//! # The Ready contract as followed here
//!
//! `handle_ready` takes a Ready, writes the received snapshot
//! ([`RaftLogStore::apply_snapshot`]), the new entries
//! ([`RaftLogStore::append`]) and the hard state
//! ([`RaftLogStore::set_hard_state`]), then [`RaftLogStore::sync`]s, and only
//! then calls `advance_append`; the light ready's commit index is written
//! with [`RaftLogStore::set_commit`] and synced too. Everything in the
//! returned [`ReadyOutput`] is therefore durable when the caller sees it:
//!
//! - every message may be sent (raft-rs lets a leader send its `messages()`
//!   before persisting; returning them after the sync is simply later, so
//!   always allowed; `persisted_messages()`, the ones that vote or
//!   acknowledge, require the sync),
//! - every committed entry handed out is covered by a durable commit index
//!   and is itself durable in the log, so a crash after applying never
//!   leaves the state machine ahead of the durable commit.
//!
//! `advance_append` (not `advance`) is used, so raft-rs's own applied index
//! moves only when the caller reports it with `advance_applied`.
//!
//! # Membership
//!
//! Committed `EntryConfChange`/`EntryConfChangeV2` entries are applied to
//! raft with `apply_conf_change` when they are handed out. The resulting
//! conf state is kept in memory ([`QuorumNode::conf_state`]);
//! [`RaftLogStore`] has no call to persist it, so snapshots carry the
//! store's own conf state. Membership changes after bootstrap therefore
//! need a `set_conf_state` in the store before they are used.

use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};

use super::store::{RaftLogStore, StoreError};

/// Raft timing and flow-control settings.
#[derive(Clone, Debug)]
pub struct QuorumConfig {
    /// Ticks without hearing from a leader before a follower campaigns
    /// (randomised in `[election_tick, 2 * election_tick)`).
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats. Must be below `election_tick`.
    pub heartbeat_tick: usize,
    /// Upper bound on the bytes of entries in one append message.
    pub max_size_per_msg: u64,
    /// Append messages in flight per follower.
    pub max_inflight_msgs: usize,
}

impl Default for QuorumConfig {
    /// 2 and 20 ticks: with a 50 ms tick, heartbeats every 100 ms and an
    /// election after 1–2 s of silence.
    fn default() -> Self {
        QuorumConfig { election_tick: 20, heartbeat_tick: 2, max_size_per_msg: 1024 * 1024, max_inflight_msgs: 256 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader; `leader` is the one it knows of, if any.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    /// The leader refused the proposal (e.g. a leadership transfer is in
    /// progress, or too many uncommitted bytes). The caller may retry.
    #[error("proposal dropped")]
    Dropped,
}

/// Who leads, as this node sees it, and in which term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderChange {
    pub leader: Option<u64>,
    pub term: u64,
    pub role: StateRole,
}

/// What one [`QuorumNode::handle_ready`] produced. All of it is durable.
#[derive(Debug, Default)]
pub struct ReadyOutput {
    /// To send to peers (`Message::to`), in order.
    pub messages: Vec<Message>,
    /// A snapshot received from the leader: the state machine must be
    /// replaced by its `data` before `committed` is applied.
    pub snapshot: Option<Snapshot>,
    /// Committed entries to apply in order: application data and also the
    /// leader's empty entries and conf changes (see [`is_app_data`]).
    pub committed: Vec<Entry>,
    /// Set when (leader, term, role) differs from the last one reported.
    pub leader_changed: Option<LeaderChange>,
}

impl ReadyOutput {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.snapshot.is_none()
            && self.committed.is_empty()
            && self.leader_changed.is_none()
    }

    /// Committed entries that carry application data.
    pub fn app_entries(&self) -> impl Iterator<Item = &Entry> {
        self.committed.iter().filter(|e| is_app_data(e))
    }

    /// The index the state machine reflects once this output is applied
    /// (for [`QuorumNode::advance_applied`]); `None` if nothing to apply.
    pub fn applied_through(&self) -> Option<u64> {
        self.committed.last().map(|e| e.index).or_else(|| self.snapshot.as_ref().map(|s| s.get_metadata().index))
    }
}

/// A normal entry with data: something the application proposed. The
/// leader's empty entry at the start of each term and conf changes are not.
pub fn is_app_data(e: &Entry) -> bool {
    e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty()
}

/// DescribeQuorum-like view of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub role: StateRole,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
    /// Per voter `(id, match index)`, sorted by id; only when leader.
    pub voters: Vec<(u64, u64)>,
}

pub struct QuorumNode<S: RaftLogStore> {
    raw: RawNode<S>,
    applied: u64,
    conf_state: ConfState,
    last_reported: Option<LeaderChange>,
}

impl<S: RaftLogStore> QuorumNode<S> {
    /// `applied` is the index the state machine already reflects (the
    /// snapshot index after a restart, 0 for a fresh store). The store must
    /// be initialised (a conf state with voters, or a snapshot).
    pub fn new(id: u64, store: S, cfg: QuorumConfig, applied: u64) -> Result<Self, NodeError> {
        let conf_state = store.initial_state()?.conf_state;
        let config = raft::Config {
            id,
            election_tick: cfg.election_tick,
            heartbeat_tick: cfg.heartbeat_tick,
            max_size_per_msg: cfg.max_size_per_msg,
            max_inflight_msgs: cfg.max_inflight_msgs,
            applied,
            pre_vote: true,
            check_quorum: true,
            ..Default::default()
        };
        config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, store, &logger)?;
        Ok(QuorumNode { raw, applied, conf_state, last_reported: None })
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    /// A leader sends every follower a heartbeat now, carrying the commit
    /// index as far as that follower's log matches.
    pub fn ping(&mut self) {
        self.raw.ping();
    }

    /// One logical clock tick.
    pub fn tick(&mut self) {
        self.raw.tick();
    }

    /// Feeds a message from a peer. Errors (a response from an unknown
    /// peer, a local message type) mean the message was ignored.
    pub fn step(&mut self, msg: Message) -> Result<(), NodeError> {
        self.raw.step(msg)?;
        Ok(())
    }

    /// Proposes `data` (must be non-empty: empty normal entries are the
    /// leader's no-ops and are filtered by [`is_app_data`]). `Ok` means it
    /// was appended to the leader's log, not that it will commit: it may
    /// still be lost to a leader change. Retrying is the caller's job.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader_id() });
        }
        match self.raw.propose(Vec::new(), data) {
            Ok(()) => Ok(()),
            Err(_) => Err(ProposeError::Dropped),
        }
    }

    /// Runs one round of the Ready contract (see the module docs). Call
    /// after `tick`, `step` or `propose`; call again until
    /// [`Self::has_ready`] is false if you want to drain everything.
    pub fn handle_ready(&mut self) -> Result<ReadyOutput, StoreError> {
        let mut out = ReadyOutput::default();
        if self.raw.has_ready() {
            let mut rd = self.raw.ready();
            out.messages = rd.take_messages();

            if !rd.snapshot().is_empty() {
                let snap = rd.snapshot().clone();
                self.raw.mut_store().apply_snapshot(&snap)?;
                self.conf_state = snap.get_metadata().get_conf_state().clone();
                out.snapshot = Some(snap);
            }
            // Entries in the log and at most the commit index of `rd.hs()`
            // (or earlier): handed out below, after the sync.
            let mut committed = rd.take_committed_entries();
            if !rd.entries().is_empty() {
                self.raw.mut_store().append(rd.entries())?;
            }
            if let Some(hs) = rd.hs() {
                let hs = hs.clone();
                self.raw.mut_store().set_hard_state(&hs)?;
            }
            self.raw.mut_store().sync()?;
            out.messages.extend(rd.take_persisted_messages());

            let mut light = self.raw.advance_append(rd);
            if let Some(commit) = light.commit_index() {
                self.raw.mut_store().set_commit(commit)?;
                self.raw.mut_store().sync()?;
            }
            out.messages.extend(light.take_messages());
            committed.extend(light.take_committed_entries());
            for e in &committed {
                self.apply_conf_change_entry(e);
            }
            out.committed = committed;
        }
        let now = LeaderChange { leader: self.leader_id(), term: self.term(), role: self.raw.raft.state };
        if self.last_reported != Some(now) {
            self.last_reported = Some(now);
            out.leader_changed = Some(now);
        }
        Ok(out)
    }

    fn apply_conf_change_entry(&mut self, e: &Entry) {
        use protobuf::Message as _;
        let res = match e.get_entry_type() {
            EntryType::EntryNormal => return,
            EntryType::EntryConfChange => match ConfChange::parse_from_bytes(&e.data) {
                Ok(cc) => self.raw.apply_conf_change(&cc),
                Err(_) => return,
            },
            EntryType::EntryConfChangeV2 => match ConfChangeV2::parse_from_bytes(&e.data) {
                Ok(cc) => self.raw.apply_conf_change(&cc),
                Err(_) => return,
            },
        };
        if let Ok(cs) = res {
            self.conf_state = cs;
        }
    }

    /// Whether [`Self::handle_ready`] has raft work to do.
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Reports that the state machine reflects everything up to `index`
    /// (a handed-out snapshot's index or committed entry). Lower or equal
    /// indexes than already reported are ignored.
    pub fn advance_applied(&mut self, index: u64) {
        if index <= self.applied {
            return;
        }
        self.applied = index;
        if index > self.raw.raft.raft_log.applied() {
            self.raw.advance_apply_to(index);
        }
    }

    /// Snapshots the state machine if the log since the last snapshot
    /// holds at least `threshold_bytes` and something was applied since.
    /// `data` must produce the state as of [`Self::applied_index`].
    /// Returns whether a snapshot was taken (and synced).
    pub fn maybe_snapshot(&mut self, threshold_bytes: u64, data: impl FnOnce() -> Vec<u8>) -> Result<bool, StoreError> {
        if self.raw.store().bytes_since_snapshot() < threshold_bytes {
            return Ok(false);
        }
        let snap_index = self.raw.store().first_index().map_err(raft_err)? - 1;
        if self.applied <= snap_index {
            return Ok(false);
        }
        self.create_snapshot(self.applied, data())?;
        Ok(true)
    }

    /// Snapshots the state machine as of `index` (which must be applied)
    /// and syncs.
    pub fn create_snapshot(&mut self, index: u64, data: Vec<u8>) -> Result<(), StoreError> {
        assert!(index <= self.applied, "snapshot at {index} beyond applied {}", self.applied);
        self.raw.mut_store().create_snapshot(index, data)?;
        self.raw.mut_store().sync()
    }

    /// The transport could not deliver to `id` (speeds up probing).
    pub fn report_unreachable(&mut self, id: u64) {
        self.raw.report_unreachable(id);
    }

    /// Whether a `MsgSnapshot` to `id` was delivered. raft-rs requires this
    /// for every sent snapshot: until then the follower's progress stays
    /// paused in the snapshot state.
    pub fn report_snapshot(&mut self, id: u64, delivered: bool) {
        let status = if delivered { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
        self.raw.report_snapshot(id, status);
    }

    pub fn leader_id(&self) -> Option<u64> {
        match self.raw.raft.leader_id {
            raft::INVALID_ID => None,
            id => Some(id),
        }
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The highest index known committed (may be above what was handed
    /// out, until the entries are persisted locally).
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// What the caller last reported with [`Self::advance_applied`].
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// The membership as of the last applied conf change or snapshot.
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    pub fn store(&self) -> &S {
        self.raw.store()
    }

    pub fn store_mut(&mut self) -> &mut S {
        self.raw.mut_store()
    }

    /// Gives the store back (e.g. to rebuild the node after a simulated
    /// crash, or to shut down).
    pub fn into_store(self) -> S {
        self.raw.raft.r.raft_log.store
    }

    /// The highest index known to be replicated on voter `id` (only while
    /// leader).
    pub fn matched(&self, id: u64) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        self.raw.raft.prs().get(id).map(|pr| pr.matched)
    }

    pub fn status(&self) -> QuorumStatus {
        let mut voters = Vec::new();
        if self.is_leader() {
            let prs = self.raw.raft.prs();
            for id in prs.conf().voters().ids().iter() {
                if let Some(pr) = prs.get(id) {
                    voters.push((id, pr.matched));
                }
            }
            voters.sort_unstable();
        }
        QuorumStatus {
            id: self.id(),
            leader: self.leader_id(),
            term: self.term(),
            role: self.role(),
            commit: self.commit_index(),
            applied: self.applied,
            last_index: self.last_index(),
            voters,
        }
    }
}

fn raft_err(e: raft::Error) -> StoreError {
    StoreError::Raft(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{HardState, SnapshotMetadata};
    use raft::{GetEntriesContext, RaftState, Storage};

    /// An in-memory store; `sync` is a no-op (nothing is ever lost).
    #[derive(Default)]
    struct MemStore {
        hs: HardState,
        cs: ConfState,
        snap: Snapshot,
        entries: Vec<Entry>,
        syncs: usize,
    }

    impl MemStore {
        fn new(voters: &[u64]) -> Self {
            let mut s = MemStore::default();
            s.cs.voters = voters.to_vec();
            s.snap.mut_metadata().set_conf_state(s.cs.clone());
            s
        }
        fn snap_index(&self) -> u64 {
            self.snap.get_metadata().index
        }
        fn unavailable() -> raft::Error {
            raft::Error::Store(raft::StorageError::Unavailable)
        }
    }

    impl Storage for MemStore {
        fn initial_state(&self) -> raft::Result<RaftState> {
            Ok(RaftState::new(self.hs.clone(), self.cs.clone()))
        }
        fn entries(
            &self,
            low: u64,
            high: u64,
            max_size: impl Into<Option<u64>>,
            _: GetEntriesContext,
        ) -> raft::Result<Vec<Entry>> {
            if low <= self.snap_index() {
                return Err(raft::Error::Store(raft::StorageError::Compacted));
            }
            if high > self.last_index()? + 1 {
                return Err(Self::unavailable());
            }
            let off = (low - self.snap_index() - 1) as usize;
            let mut v = self.entries[off..off + (high - low) as usize].to_vec();
            raft::util::limit_size(&mut v, max_size.into());
            Ok(v)
        }
        fn term(&self, idx: u64) -> raft::Result<u64> {
            if idx == self.snap_index() {
                return Ok(self.snap.get_metadata().term);
            }
            if idx < self.snap_index() {
                return Err(raft::Error::Store(raft::StorageError::Compacted));
            }
            match self.entries.get((idx - self.snap_index() - 1) as usize) {
                Some(e) => Ok(e.term),
                None => Err(Self::unavailable()),
            }
        }
        fn first_index(&self) -> raft::Result<u64> {
            Ok(self.snap_index() + 1)
        }
        fn last_index(&self) -> raft::Result<u64> {
            Ok(self.snap_index() + self.entries.len() as u64)
        }
        fn snapshot(&self, _: u64, _: u64) -> raft::Result<Snapshot> {
            Ok(self.snap.clone())
        }
    }

    impl RaftLogStore for MemStore {
        fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
            let Some(first) = entries.first() else { return Ok(()) };
            let keep = (first.index - self.snap_index() - 1) as usize;
            self.entries.truncate(keep);
            self.entries.extend_from_slice(entries);
            Ok(())
        }
        fn set_hard_state(&mut self, hs: &HardState) -> Result<(), StoreError> {
            self.hs = hs.clone();
            Ok(())
        }
        fn set_commit(&mut self, commit: u64) -> Result<(), StoreError> {
            self.hs.commit = commit;
            Ok(())
        }
        fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
            let m = snapshot.get_metadata();
            self.entries.clear();
            self.cs = m.get_conf_state().clone();
            self.hs.commit = self.hs.commit.max(m.index);
            self.hs.term = self.hs.term.max(m.term);
            self.snap = snapshot.clone();
            Ok(())
        }
        fn create_snapshot(&mut self, index: u64, data: Vec<u8>) -> Result<(), StoreError> {
            let term = self.term(index).map_err(raft_err)?;
            let drop = (index - self.snap_index()) as usize;
            self.entries.drain(..drop);
            let mut meta = SnapshotMetadata { index, term, ..Default::default() };
            meta.set_conf_state(self.cs.clone());
            self.snap = Snapshot::default();
            self.snap.set_metadata(meta);
            self.snap.data = data.into();
            Ok(())
        }
        fn sync(&mut self) -> Result<(), StoreError> {
            self.syncs += 1;
            Ok(())
        }
        fn bytes_since_snapshot(&self) -> u64 {
            self.entries.iter().map(|e| e.data.len() as u64).sum()
        }
    }

    fn cfg() -> QuorumConfig {
        QuorumConfig { election_tick: 10, heartbeat_tick: 2, ..Default::default() }
    }

    #[test]
    fn single_voter_elects_itself_and_commits() {
        let mut n = QuorumNode::new(1, MemStore::new(&[1]), cfg(), 0).unwrap();
        let mut leader_seen = None;
        for _ in 0..40 {
            n.tick();
            let out = n.handle_ready().unwrap();
            assert!(out.messages.is_empty(), "a single voter sends nothing");
            if let Some(lc) = out.leader_changed {
                leader_seen = Some(lc);
            }
            n.advance_applied(out.applied_through().unwrap_or(0));
        }
        assert!(n.is_leader());
        assert_eq!(leader_seen.unwrap().leader, Some(1));
        // An empty proposal is accepted, and filtered out on apply.
        assert!(n.propose(b"".to_vec()).is_ok());
        n.propose(b"hello".to_vec()).unwrap();
        let out = n.handle_ready().unwrap();
        let data: Vec<&[u8]> = out.app_entries().map(|e| &e.data[..]).collect();
        assert_eq!(data, vec![&b"hello"[..]]);
        let idx = out.applied_through().unwrap();
        assert_eq!(n.commit_index(), idx);
        assert_eq!(n.store().hs.commit, idx, "the commit is in the store before it is handed out");
        assert!(n.store().syncs > 0);
        n.advance_applied(idx);
        assert_eq!(n.applied_index(), idx);

        let st = n.status();
        assert_eq!(st.leader, Some(1));
        assert_eq!(st.voters, vec![(1, idx)]);

        // Snapshot and restart from it.
        assert!(n.maybe_snapshot(1, || b"state".to_vec()).unwrap());
        assert!(!n.maybe_snapshot(1, || unreachable!()).unwrap());
        let store = n.into_store();
        assert_eq!(store.snap_index(), idx);
        assert!(store.entries.is_empty());
        let mut n = QuorumNode::new(1, store, cfg(), idx).unwrap();
        assert_eq!(n.applied_index(), idx);
        let mut later = Vec::new();
        for _ in 0..40 {
            n.tick();
            let out = n.handle_ready().unwrap();
            assert!(out.snapshot.is_none());
            later.extend(out.committed.iter().map(|e| e.index));
            n.advance_applied(out.applied_through().unwrap_or(0));
        }
        assert!(n.is_leader());
        assert!(later.iter().all(|&i| i > idx), "nothing at or below the snapshot is re-applied");
        n.propose(b"again".to_vec()).unwrap();
        let out = n.handle_ready().unwrap();
        assert_eq!(out.app_entries().map(|e| &e.data[..]).collect::<Vec<_>>(), vec![&b"again"[..]]);
    }

    /// Delivers every message until the group is quiet; returns the app
    /// payloads each node applied.
    fn pump(nodes: &mut [QuorumNode<MemStore>], applied: &mut [Vec<Vec<u8>>]) {
        loop {
            let mut msgs = Vec::new();
            for (i, n) in nodes.iter_mut().enumerate() {
                let out = n.handle_ready().unwrap();
                applied[i].extend(out.app_entries().map(|e| e.data.to_vec()));
                if let Some(i) = out.applied_through() {
                    n.advance_applied(i);
                }
                msgs.extend(out.messages);
            }
            if msgs.is_empty() {
                break;
            }
            for m in msgs {
                let _ = nodes[(m.to - 1) as usize].step(m);
            }
        }
    }

    #[test]
    fn three_voters_elect_one_leader_and_replicate() {
        let mut nodes: Vec<_> =
            (1..=3).map(|id| QuorumNode::new(id, MemStore::new(&[1, 2, 3]), cfg(), 0).unwrap()).collect();
        let mut applied = vec![Vec::new(); 3];
        for _ in 0..100 {
            for n in nodes.iter_mut() {
                n.tick();
            }
            pump(&mut nodes, &mut applied);
            if nodes.iter().any(|n| n.is_leader()) {
                break;
            }
        }
        let leaders: Vec<u64> = nodes.iter().filter(|n| n.is_leader()).map(|n| n.id()).collect();
        assert_eq!(leaders.len(), 1);
        let leader = leaders[0];
        for n in &nodes {
            assert_eq!(n.leader_id(), Some(leader));
        }
        let follower = nodes.iter_mut().find(|n| !n.is_leader()).unwrap();
        assert_eq!(follower.propose(b"x".to_vec()), Err(ProposeError::NotLeader { leader: Some(leader) }));

        let l = (leader - 1) as usize;
        nodes[l].propose(b"a".to_vec()).unwrap();
        nodes[l].propose(b"b".to_vec()).unwrap();
        pump(&mut nodes, &mut applied);
        for a in &applied {
            assert_eq!(a, &vec![b"a".to_vec(), b"b".to_vec()]);
        }
        let st = nodes[l].status();
        let last = nodes[l].last_index();
        assert_eq!(st.voters, vec![(1, last), (2, last), (3, last)]);
        for n in &nodes {
            assert_eq!(n.commit_index(), last);
            assert_eq!(n.applied_index(), last);
        }
    }
}
