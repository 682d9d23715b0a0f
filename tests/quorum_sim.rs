//! Deterministic simulation of a metadata quorum: 3 and 5 [`QuorumNode`]s
//! over a simulated network (delays, drops, duplicates, reordering,
//! partitions) with crashes that lose unsynced writes (torn: a random
//! prefix of them survives), restarts from the durable state, and
//! snapshots. Everything derives from one u64 seed.
//!
//! - `STRAND_SIM_SEEDS=N`: seeds per cluster size (default 50).
//! - `STRAND_SIM_SEED=S`: run only seed `S` (replay a failure).
//! - `STRAND_SIM_STEPS=N`: steps per seed (default 20000).
//!
//! Checked after every step: at most one leader per term; committed
//! entries never change (every committed report agrees with a global
//! index → (term, data) map); each node applies a contiguous prefix of that
//! log; a payload commits at most once. At the end everything heals and a
//! proposal must commit on every node within a bound.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};

use raft::eraftpb::{ConfState, Entry, HardState, Message, MessageType, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage};
use strand::controller::node::*;
use strand::controller::store::*;

// ---------------------------------------------------------------- RNG

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `p_permille / 1000`.
    fn chance(&mut self, p_permille: u64) -> bool {
        self.below(1000) < p_permille
    }
}

// ---------------------------------------------------------------- store

#[derive(Clone, Default)]
struct LogState {
    hs: HardState,
    cs: ConfState,
    snap: Snapshot,
    entries: Vec<Entry>,
}

#[derive(Clone)]
enum Op {
    Append(Vec<Entry>),
    HardState(HardState),
    Commit(u64),
    ApplySnapshot(Snapshot),
    CreateSnapshot(u64, Vec<u8>),
}

impl LogState {
    fn snap_index(&self) -> u64 {
        self.snap.get_metadata().index
    }
    fn last_index(&self) -> u64 {
        self.snap_index() + self.entries.len() as u64
    }
    fn term(&self, idx: u64) -> Option<u64> {
        if idx == self.snap_index() {
            return Some(self.snap.get_metadata().term);
        }
        if idx < self.snap_index() {
            return None;
        }
        self.entries.get((idx - self.snap_index() - 1) as usize).map(|e| e.term)
    }
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Append(entries) => {
                let Some(first) = entries.first() else { return };
                assert!(first.index > self.snap_index(), "append below the snapshot");
                assert!(first.index <= self.last_index() + 1, "append leaves a gap");
                self.entries.truncate((first.index - self.snap_index() - 1) as usize);
                self.entries.extend_from_slice(entries);
            }
            Op::HardState(hs) => self.hs = hs.clone(),
            Op::Commit(c) => self.hs.commit = *c,
            Op::ApplySnapshot(s) => {
                let m = s.get_metadata();
                if self.term(m.index) == Some(m.term) && m.index <= self.last_index() {
                    let drop = (m.index - self.snap_index()) as usize;
                    self.entries.drain(..drop);
                } else {
                    self.entries.clear();
                }
                self.cs = m.get_conf_state().clone();
                self.hs.commit = self.hs.commit.max(m.index);
                self.snap = s.clone();
            }
            Op::CreateSnapshot(index, data) => {
                let term = self.term(*index).expect("snapshot index in the log");
                let drop = (index - self.snap_index()) as usize;
                self.entries.drain(..drop);
                let mut meta = SnapshotMetadata { index: *index, term, ..Default::default() };
                meta.set_conf_state(self.cs.clone());
                let mut snap = Snapshot::default();
                snap.set_metadata(meta);
                snap.data = data.clone().into();
                self.snap = snap;
                self.hs.commit = self.hs.commit.max(*index);
            }
        }
    }
}

/// `current` is what reads see; `durable` what survives a crash; `pending`
/// the writes since the last sync, in order.
struct SimStore {
    current: LogState,
    durable: LogState,
    pending: Vec<Op>,
    /// Fail (crash) at the n-th next sync (0 = the next one).
    crash_at_sync: Option<u32>,
}

impl SimStore {
    fn new(voters: &[u64]) -> Self {
        let mut s = LogState::default();
        s.cs.voters = voters.to_vec();
        s.snap.mut_metadata().set_conf_state(s.cs.clone());
        SimStore { current: s.clone(), durable: s, pending: Vec::new(), crash_at_sync: None }
    }

    fn write(&mut self, op: Op) {
        self.current.apply(&op);
        self.pending.push(op);
    }

    /// The store as it comes back after a crash: the durable state plus a
    /// random prefix of the unsynced writes, the last of them possibly torn
    /// (a prefix of an append's entries).
    fn crash(self, rng: &mut Rng) -> SimStore {
        let mut state = self.durable;
        let keep = rng.below(self.pending.len() as u64 + 1) as usize;
        for op in &self.pending[..keep] {
            state.apply(op);
        }
        if let Some(Op::Append(entries)) = self.pending.get(keep) {
            if entries.len() > 1 && rng.chance(500) {
                let n = 1 + rng.below(entries.len() as u64 - 1) as usize;
                state.apply(&Op::Append(entries[..n].to_vec()));
            }
        }
        SimStore { current: state.clone(), durable: state, pending: Vec::new(), crash_at_sync: None }
    }
}

fn unavailable() -> raft::Error {
    raft::Error::Store(raft::StorageError::Unavailable)
}

impl Storage for SimStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.current.hs.clone(), self.current.cs.clone()))
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let s = &self.current;
        if low <= s.snap_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if high > s.last_index() + 1 {
            return Err(unavailable());
        }
        let off = (low - s.snap_index() - 1) as usize;
        let mut v = s.entries[off..off + (high - low) as usize].to_vec();
        raft::util::limit_size(&mut v, max_size.into());
        Ok(v)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.current.snap_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        self.current.term(idx).ok_or_else(unavailable)
    }
    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.current.snap_index() + 1)
    }
    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.current.last_index())
    }
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.current.snap_index() < request_index {
            return Err(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.current.snap.clone())
    }
}

impl RaftLogStore for SimStore {
    fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        self.write(Op::Append(entries.to_vec()));
        Ok(())
    }
    fn set_hard_state(&mut self, hs: &HardState) -> Result<(), StoreError> {
        self.write(Op::HardState(hs.clone()));
        Ok(())
    }
    fn set_commit(&mut self, commit: u64) -> Result<(), StoreError> {
        self.write(Op::Commit(commit));
        Ok(())
    }
    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        self.write(Op::ApplySnapshot(snapshot.clone()));
        Ok(())
    }
    fn create_snapshot(&mut self, index: u64, data: Vec<u8>) -> Result<(), StoreError> {
        self.write(Op::CreateSnapshot(index, data));
        Ok(())
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        match self.crash_at_sync {
            Some(0) => return Err(StoreError::Raft("simulated crash during sync".into())),
            Some(n) => self.crash_at_sync = Some(n - 1),
            None => {}
        }
        for op in self.pending.drain(..) {
            self.durable.apply(&op);
        }
        Ok(())
    }
    fn bytes_since_snapshot(&self) -> u64 {
        self.current.entries.iter().map(|e| e.data.len() as u64 + 16).sum()
    }
}

// ---------------------------------------------------------------- state machine

/// The state machine: the applied payloads with their indexes.
fn encode(sm: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, d) in sm {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&(d.len() as u32).to_le_bytes());
        out.extend_from_slice(d);
    }
    out
}

fn decode(mut b: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut sm = Vec::new();
    while !b.is_empty() {
        let i = u64::from_le_bytes(b[..8].try_into().unwrap());
        let n = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
        sm.push((i, b[12..12 + n].to_vec()));
        b = &b[12 + n..];
    }
    sm
}

// ---------------------------------------------------------------- simulation

thread_local! {
    static STEP: Cell<u64> = const { Cell::new(0) };
}

const TICK_UNITS: u64 = 10;
const SNAPSHOT_BYTES: u64 = 400;

struct SimNode {
    node: Option<QuorumNode<SimStore>>,
    /// The store while the node is down.
    down: Option<SimStore>,
    sm: Vec<(u64, Vec<u8>)>,
    /// The index the state machine reflects.
    applied: u64,
}

struct InFlight {
    at: u64,
    seq: u64,
    msg: Message,
}

struct Sim {
    seed: u64,
    rng: Rng,
    n: u64,
    nodes: Vec<SimNode>,
    net: Vec<InFlight>,
    seq: u64,
    now: u64,
    /// Partition group of each node; messages cross only within a group.
    group: Vec<u8>,
    faults: bool,
    leaders: HashMap<u64, u64>,
    committed: BTreeMap<u64, (u64, Vec<u8>)>,
    payload_at: HashMap<Vec<u8>, u64>,
    proposed: HashSet<Vec<u8>>,
    next_payload: u64,
    stats: Stats,
}

#[derive(Default, Debug)]
struct Stats {
    proposed_ok: u64,
    committed: u64,
    crashes: u64,
    sync_crashes: u64,
    snapshots_taken: u64,
    snapshots_received: u64,
    elections: u64,
}

fn cfg() -> QuorumConfig {
    QuorumConfig { election_tick: 10, heartbeat_tick: 2, max_size_per_msg: 256, max_inflight_msgs: 8 }
}

impl Sim {
    fn new(seed: u64, n: u64) -> Sim {
        let voters: Vec<u64> = (1..=n).collect();
        let nodes = voters
            .iter()
            .map(|&id| SimNode {
                node: Some(QuorumNode::new(id, SimStore::new(&voters), cfg(), 0).unwrap()),
                down: None,
                sm: Vec::new(),
                applied: 0,
            })
            .collect();
        Sim {
            seed,
            rng: Rng::new(seed),
            n,
            nodes,
            net: Vec::new(),
            seq: 0,
            now: 0,
            group: vec![0; n as usize],
            faults: true,
            leaders: HashMap::new(),
            committed: BTreeMap::new(),
            payload_at: HashMap::new(),
            proposed: HashSet::new(),
            next_payload: 0,
            stats: Stats::default(),
        }
    }

    fn up(&self, id: u64) -> bool {
        self.nodes[(id - 1) as usize].node.is_some()
    }

    fn crash(&mut self, id: u64) {
        let sn = &mut self.nodes[(id - 1) as usize];
        let Some(node) = sn.node.take() else { return };
        sn.down = Some(node.into_store().crash(&mut self.rng));
        sn.sm.clear();
        sn.applied = 0;
        self.stats.crashes += 1;
    }

    fn restart(&mut self, id: u64) {
        let sn = &mut self.nodes[(id - 1) as usize];
        let Some(store) = sn.down.take() else { return };
        let snap = store.current.snap.clone();
        let index = snap.get_metadata().index;
        let node =
            QuorumNode::new(id, store, cfg(), index).unwrap_or_else(|e| panic!("restart of node {id} failed: {e}"));
        sn.sm = decode(&snap.data);
        sn.applied = index;
        sn.node = Some(node);
    }

    fn send(&mut self, msg: Message) {
        let (from, to) = (msg.from, msg.to);
        let is_snap = msg.get_msg_type() == MessageType::MsgSnapshot;
        if self.faults && self.rng.chance(50) {
            if is_snap {
                self.report_snapshot(from, to, false);
            }
            return;
        }
        let copies = if self.faults && self.rng.chance(20) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = if self.faults { 1 + self.rng.below(3 * TICK_UNITS) } else { 1 + self.rng.below(5) };
            self.seq += 1;
            self.net.push(InFlight { at: self.now + delay, seq: self.seq, msg: msg.clone() });
        }
    }

    fn report_snapshot(&mut self, from: u64, to: u64, delivered: bool) {
        if let Some(node) = self.nodes[(from - 1) as usize].node.as_mut() {
            node.report_snapshot(to, delivered);
        }
    }

    fn deliver_due(&mut self) {
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            if self.net[i].at <= self.now {
                due.push(self.net.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|f| (f.at, f.seq));
        for f in due {
            let (from, to) = (f.msg.from, f.msg.to);
            let is_snap = f.msg.get_msg_type() == MessageType::MsgSnapshot;
            let reachable = self.up(to) && self.group[(from - 1) as usize] == self.group[(to - 1) as usize];
            if !reachable {
                if is_snap {
                    self.report_snapshot(from, to, false);
                }
                continue;
            }
            if is_snap {
                self.stats.snapshots_received += 1;
            }
            let _ = self.nodes[(to - 1) as usize].node.as_mut().unwrap().step(f.msg);
            if is_snap {
                self.report_snapshot(from, to, true);
            }
        }
    }

    fn propose(&mut self, id: u64) -> Option<Vec<u8>> {
        let seed = self.seed;
        let n = self.next_payload;
        let node = self.nodes[(id - 1) as usize].node.as_mut()?;
        let payload = format!("s{seed}-p{n}-via{id}").into_bytes();
        self.next_payload += 1;
        match node.propose(payload.clone()) {
            Ok(()) => {
                self.stats.proposed_ok += 1;
                self.proposed.insert(payload.clone());
                Some(payload)
            }
            Err(ProposeError::NotLeader { .. }) | Err(ProposeError::Dropped) => None,
        }
    }

    /// Runs the Ready loop on every up node; checks what comes out.
    fn ready_all(&mut self) {
        for idx in 0..self.nodes.len() {
            for _ in 0..8 {
                let Some(node) = self.nodes[idx].node.as_mut() else { break };
                if !node.has_ready() {
                    break;
                }
                if self.faults && self.rng.chance(3) {
                    node.store_mut().crash_at_sync = Some(self.rng.below(2) as u32);
                }
                let res = node.handle_ready();
                node.store_mut().crash_at_sync = None;
                match res {
                    Ok(out) => self.process(idx, out),
                    Err(_) => {
                        self.stats.sync_crashes += 1;
                        self.crash(idx as u64 + 1);
                        break;
                    }
                }
            }
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!("{what}")
    }

    fn process(&mut self, idx: usize, out: ReadyOutput) {
        let id = idx as u64 + 1;
        if let Some(lc) = out.leader_changed {
            if lc.role == raft::StateRole::Leader {
                self.stats.elections += 1;
            }
        }
        if let Some(snap) = &out.snapshot {
            let s = snap.get_metadata().index;
            let sm = decode(&snap.data);
            let expect: Vec<(u64, Vec<u8>)> = (1..=s)
                .map(|i| match self.committed.get(&i) {
                    Some(e) => (i, e),
                    None => self.fail(format!("node {id} got snapshot at {s} but {i} was never reported committed")),
                })
                .filter(|(_, (_, d))| !d.is_empty())
                .map(|(i, (_, d))| (i, d.clone()))
                .collect();
            if sm != expect {
                self.fail(format!("node {id}: snapshot at {s} disagrees with the committed log"));
            }
            if s < self.nodes[idx].applied {
                self.fail(format!("node {id}: snapshot at {s} behind applied {}", self.nodes[idx].applied));
            }
            self.nodes[idx].sm = sm;
            self.nodes[idx].applied = s;
        }
        for e in &out.committed {
            let expected = self.nodes[idx].applied + 1;
            if e.index != expected {
                self.fail(format!("node {id}: committed entry {} handed out, expected {expected}", e.index));
            }
            let data = e.data.to_vec();
            match self.committed.get(&e.index) {
                Some((t, d)) if *t == e.term && *d == data => {}
                Some((t, _)) => self.fail(format!(
                    "node {id}: entry {} committed as term {} but earlier as term {t} (or other data)",
                    e.index, e.term
                )),
                None => {
                    if is_app_data(e) {
                        if !self.proposed.contains(&data) {
                            self.fail(format!("node {id}: committed payload never proposed at {}", e.index));
                        }
                        if let Some(at) = self.payload_at.insert(data.clone(), e.index) {
                            self.fail(format!("payload committed twice: at {at} and {}", e.index));
                        }
                    }
                    self.committed.insert(e.index, (e.term, data.clone()));
                }
            }
            if is_app_data(e) {
                self.nodes[idx].sm.push((e.index, data));
            }
            self.nodes[idx].applied = e.index;
        }
        let sn = &mut self.nodes[idx];
        let node = sn.node.as_mut().unwrap();
        node.advance_applied(sn.applied);
        let sm = &sn.sm;
        match node.maybe_snapshot(SNAPSHOT_BYTES, || encode(sm)) {
            Ok(true) => self.stats.snapshots_taken += 1,
            Ok(false) => {}
            Err(e) => panic!("node {id}: snapshot failed: {e}"),
        }
        for m in out.messages {
            self.send(m);
        }
    }

    fn check(&mut self) {
        for sn in &self.nodes {
            let Some(node) = &sn.node else { continue };
            let term = node.term();
            let claimed = if node.is_leader() { Some(node.id()) } else { node.leader_id() };
            if let Some(l) = claimed {
                match self.leaders.insert(term, l) {
                    Some(prev) if prev != l => {
                        panic!("two leaders in term {term}: {prev} and {l} (seen by {})", node.id())
                    }
                    _ => {}
                }
            }
            if node.applied_index() != sn.applied {
                panic!("node {}: applied {} vs reported {}", node.id(), node.applied_index(), sn.applied);
            }
        }
    }

    fn step(&mut self) {
        self.now += 1;
        if self.now.is_multiple_of(TICK_UNITS) {
            for sn in self.nodes.iter_mut() {
                if let Some(node) = sn.node.as_mut() {
                    node.tick();
                }
            }
        }
        self.deliver_due();
        if self.faults {
            let r = &mut self.rng;
            if r.chance(60) {
                let id = 1 + r.below(self.n);
                self.propose(id);
            }
            if self.rng.chance(3) {
                let id = 1 + self.rng.below(self.n);
                self.crash(id);
            }
            for id in 1..=self.n {
                if !self.up(id) && self.rng.chance(15) {
                    self.restart(id);
                }
            }
            if self.rng.chance(3) {
                for g in self.group.iter_mut() {
                    *g = 0;
                }
                let cut = 1 + self.rng.below(self.n - 1);
                for _ in 0..cut {
                    let i = self.rng.below(self.n) as usize;
                    self.group[i] = 1;
                }
            }
            if self.rng.chance(8) {
                self.group.iter_mut().for_each(|g| *g = 0);
            }
        }
        self.ready_all();
        self.check();
    }

    /// Heals everything and requires a proposal to commit everywhere.
    fn liveness(&mut self) {
        self.faults = false;
        self.group.iter_mut().for_each(|g| *g = 0);
        for id in 1..=self.n {
            self.restart(id);
        }
        let bound = 400 * TICK_UNITS;
        let mut proposed: Vec<Vec<u8>> = Vec::new();
        for t in 0..bound {
            if t % (20 * TICK_UNITS) == 0 {
                if let Some(l) =
                    (1..=self.n).find(|&id| self.nodes[(id - 1) as usize].node.as_ref().unwrap().is_leader())
                {
                    if let Some(p) = self.propose(l) {
                        proposed.push(p);
                    }
                }
            }
            STEP.with(|s| s.set(s.get() + 1));
            self.step();
            let everywhere = proposed.iter().any(|p| self.nodes.iter().all(|sn| sn.sm.iter().any(|(_, d)| d == p)));
            if everywhere {
                self.final_check();
                return;
            }
        }
        self.fail(format!("no proposal committed on all nodes within {bound} steps after healing"));
    }

    fn final_check(&self) {
        for (i, sn) in self.nodes.iter().enumerate() {
            let expect: Vec<(u64, Vec<u8>)> = self
                .committed
                .range(..=sn.applied)
                .filter(|(_, (_, d))| !d.is_empty())
                .map(|(i, (_, d))| (*i, d.clone()))
                .collect();
            if sn.sm != expect {
                self.fail(format!("node {}: state machine is not the committed prefix", i + 1));
            }
        }
    }
}

fn run_seed(seed: u64, n: u64, steps: u64) -> Stats {
    STEP.with(|s| s.set(0));
    let mut sim = Sim::new(seed, n);
    for step in 0..steps {
        STEP.with(|s| s.set(step));
        sim.step();
    }
    sim.liveness();
    sim.stats.committed = sim.payload_at.len() as u64;
    sim.stats
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number")))
}

fn run(n: u64) {
    let steps = env_u64("STRAND_SIM_STEPS").unwrap_or(20_000);
    let seeds: Vec<u64> = match env_u64("STRAND_SIM_SEED") {
        Some(s) => vec![s],
        None => (1..=env_u64("STRAND_SIM_SEEDS").unwrap_or(50)).collect(),
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    for seed in seeds {
        println!("quorum_sim: {n} nodes, seed {seed}");
        let r = std::panic::catch_unwind(|| run_seed(seed, n, steps));
        match r {
            Ok(s) => {
                total.proposed_ok += s.proposed_ok;
                total.committed += s.committed;
                total.crashes += s.crashes;
                total.sync_crashes += s.sync_crashes;
                total.snapshots_taken += s.snapshots_taken;
                total.snapshots_received += s.snapshots_received;
                total.elections += s.elections;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let step = STEP.with(|s| s.get());
                panic!(
                    "quorum_sim ({n} nodes) failed: seed {seed}, step {step}: {msg}\n\
                     replay: STRAND_SIM_SEED={seed} cargo test --test quorum_sim"
                );
            }
        }
    }
    println!("quorum_sim: {n} nodes: {total:?} in {:?}", started.elapsed());
}

#[test]
fn sim_three_nodes() {
    run(3);
}

#[test]
fn sim_five_nodes() {
    run(5);
}
