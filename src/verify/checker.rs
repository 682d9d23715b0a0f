//! The checker: reads a [`History`] and names what went wrong, in the
//! anomaly classes of Jepsen's Kafka workload. It only trusts what the
//! history shows: an acknowledged write is one whose send returned an
//! offset (and, in a transaction, whose commit returned), the order of a
//! partition is the set of offsets any read returned, and an operation
//! that ended `Unknown` may have happened or not.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use super::history::{History, Isolation, Mode, OpKind, Outcome};

/// What the checker looks for. The names are Jepsen's where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Anomaly {
    /// Acknowledged, never read, though reads went past its offset.
    LostWrite,
    /// Acknowledged, never read, and no read reached its offset (after the
    /// final read: the log ends before it).
    Unseen,
    /// One value at two positions (ack or read) of one topic.
    Duplicate,
    /// One offset of a partition holding two values.
    InconsistentOffsets,
    /// A read_committed read of a value whose transaction aborted (G1a).
    AbortedRead,
    /// A read_committed read that returned a value before its transaction's
    /// commit was even asked for (G1b, precommitted read).
    PrecommittedRead,
    /// An assign-mode consumer stepping over an offset other reads saw.
    PollSkip,
    /// An assign-mode consumer going back or standing still.
    NonMonotonicPoll,
    /// A producer's later send (started after the earlier one ended) to a
    /// partition getting a lower offset.
    NonMonotonicSend,
    /// A group's committed offset read back lower than a commit acknowledged
    /// before the read began.
    CommittedOffsetBackwards,
    /// A partition's last stable offset held below its high watermark for
    /// longer than the transaction timeout.
    LsoStuck,
    /// Consume-transform-produce: an input missing from the committed
    /// output, there more than once, or an output with no input.
    TransformNotExactlyOnce,
}

impl Anomaly {
    pub const ALL: [Anomaly; 12] = [
        Anomaly::LostWrite,
        Anomaly::Unseen,
        Anomaly::Duplicate,
        Anomaly::InconsistentOffsets,
        Anomaly::AbortedRead,
        Anomaly::PrecommittedRead,
        Anomaly::PollSkip,
        Anomaly::NonMonotonicPoll,
        Anomaly::NonMonotonicSend,
        Anomaly::CommittedOffsetBackwards,
        Anomaly::LsoStuck,
        Anomaly::TransformNotExactlyOnce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Anomaly::LostWrite => "lost-write",
            Anomaly::Unseen => "unseen",
            Anomaly::Duplicate => "duplicate",
            Anomaly::InconsistentOffsets => "inconsistent-offsets",
            Anomaly::AbortedRead => "aborted-read (G1a)",
            Anomaly::PrecommittedRead => "precommitted-read (G1b)",
            Anomaly::PollSkip => "poll-skip",
            Anomaly::NonMonotonicPoll => "nonmonotonic-poll",
            Anomaly::NonMonotonicSend => "nonmonotonic-send",
            Anomaly::CommittedOffsetBackwards => "committed-offset-backwards",
            Anomaly::LsoStuck => "lso-stuck",
            Anomaly::TransformNotExactlyOnce => "transform-not-exactly-once",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// The producers' `transaction.timeout.ms`: an LSO held below the high
    /// watermark for longer than this plus `lso_slack_ms` is stuck.
    pub txn_timeout_ms: Option<u64>,
    /// Time the broker may take past the timeout to abort (its check
    /// interval, a fault's recovery).
    pub lso_slack_ms: u64,
    /// Consume-transform-produce: (input topic, output topic). Each output
    /// record's value is its input's value, optionally followed by `|` and
    /// a tag unique to the attempt (so that every send stays unique).
    pub transform: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub anomaly: Anomaly,
    pub detail: String,
}

/// Counts of what the history holds, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub sends: usize,
    /// Sends answered with an offset.
    pub answered: usize,
    /// Of those, the ones that count as written: outside a transaction, or
    /// in one that committed.
    pub acknowledged: usize,
    pub failed: usize,
    pub unknown: usize,
    pub txns_committed: usize,
    pub txns_aborted: usize,
    pub polls: usize,
    pub records_read: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub stats: Stats,
}

/// Examples of each anomaly a table shows.
const EXAMPLES: usize = 3;

impl Report {
    pub fn count(&self, anomaly: Anomaly) -> usize {
        self.findings.iter().filter(|f| f.anomaly == anomaly).count()
    }

    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// The summary table: every class with its count and a few examples.
    pub fn table(&self) -> String {
        let s = &self.stats;
        let mut out = format!(
            "sends {} (answered {}, acknowledged {}, failed {}, unknown {}), transactions committed {} aborted {}, polls {}, records read {}\n",
            s.sends, s.answered, s.acknowledged, s.failed, s.unknown, s.txns_committed, s.txns_aborted, s.polls, s.records_read
        );
        let _ = writeln!(out, "{:<28} {:>6}  example", "anomaly", "count");
        for a in Anomaly::ALL {
            let mut examples = self.findings.iter().filter(|f| f.anomaly == a);
            let first = examples.next().map(|f| f.detail.as_str()).unwrap_or("");
            let _ = writeln!(out, "{:<28} {:>6}  {first}", a.name(), self.count(a));
            for f in examples.take(EXAMPLES - 1) {
                let _ = writeln!(out, "{:<28} {:>6}  {}", "", "", f.detail);
            }
        }
        out
    }
}

/// What became of a transaction, as far as the history tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnFate {
    /// Its commit returned; `asked_ms` is when the commit was called.
    Committed {
        asked_ms: u64,
    },
    Aborted,
    Unknown,
}

struct SendInfo {
    topic: String,
    partition: i32,
    offset: Option<i64>,
    outcome: Outcome,
    txn: Option<u64>,
}

type Tp = (String, i32);
/// A send's start, end and acknowledged offset.
type SendTimes = (u64, u64, i64);

pub fn check(history: &History, options: &CheckOptions) -> Report {
    let mut report = Report::default();
    let mut flag = |anomaly: Anomaly, detail: String| report.findings.push(Finding { anomaly, detail });

    // Transactions: the last EndTxn of each decides. A commit that failed
    // outright leaves an abort; a transaction that never ended was never
    // committed, so the broker aborts it. Only an unknown end stays unknown.
    let mut fates: HashMap<u64, TxnFate> = HashMap::new();
    for op in &history.ops {
        if let OpKind::EndTxn { txn, commit, outcome } = &op.kind {
            let fate = match (commit, outcome) {
                (true, Outcome::Ok) => TxnFate::Committed { asked_ms: op.start_ms },
                (true, Outcome::Failed) | (false, Outcome::Ok) => TxnFate::Aborted,
                _ => TxnFate::Unknown,
            };
            fates.insert(*txn, fate);
        }
    }
    let fate = |txn: Option<u64>| txn.map(|t| fates.get(&t).copied().unwrap_or(TxnFate::Aborted));

    // Sends, by value (values are unique in a history).
    let mut sends: HashMap<&str, SendInfo> = HashMap::new();
    let mut stats = Stats::default();
    for op in &history.ops {
        if let OpKind::Send { topic, partition, value, outcome, offset, txn } = &op.kind {
            stats.sends += 1;
            match outcome {
                Outcome::Ok => stats.answered += 1,
                Outcome::Failed => stats.failed += 1,
                Outcome::Unknown => stats.unknown += 1,
            }
            let info =
                SendInfo { topic: topic.clone(), partition: *partition, offset: *offset, outcome: *outcome, txn: *txn };
            sends.insert(value.as_str(), info);
        }
    }
    stats.txns_committed = fates.values().filter(|f| matches!(f, TxnFate::Committed { .. })).count();
    stats.txns_aborted = fates.values().filter(|f| **f == TxnFate::Aborted).count();
    let acknowledged = |s: &SendInfo| {
        s.outcome == Outcome::Ok
            && s.offset.is_some()
            && !matches!(fate(s.txn), Some(TxnFate::Aborted | TxnFate::Unknown))
    };
    stats.acknowledged = sends.values().filter(|s| acknowledged(s)).count();

    // Everything known about positions: acknowledged offsets and reads.
    let mut at_offset: BTreeMap<(Tp, i64), BTreeSet<&str>> = BTreeMap::new();
    let mut positions: BTreeMap<(&str, &str), BTreeSet<(i32, i64)>> = BTreeMap::new();
    for (value, s) in &sends {
        if let (Outcome::Ok, Some(offset)) = (s.outcome, s.offset) {
            at_offset.entry(((s.topic.clone(), s.partition), offset)).or_default().insert(value);
            positions.entry((s.topic.as_str(), value)).or_default().insert((s.partition, offset));
        }
    }
    // The order of each partition as readers of each isolation saw it.
    let mut order: HashMap<(Isolation, Tp), BTreeSet<i64>> = HashMap::new();
    let mut furthest: HashMap<Tp, i64> = HashMap::new();
    let mut read_values: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut committed_output: BTreeMap<&str, BTreeSet<(i32, i64)>> = BTreeMap::new();
    for op in &history.ops {
        let OpKind::Poll { isolation, records, .. } = &op.kind else { continue };
        stats.polls += 1;
        stats.records_read += records.len();
        for r in records {
            let tp = (r.topic.clone(), r.partition);
            at_offset.entry((tp.clone(), r.offset)).or_default().insert(&r.value);
            positions.entry((&r.topic, &r.value)).or_default().insert((r.partition, r.offset));
            order.entry((*isolation, tp.clone())).or_default().insert(r.offset);
            let f = furthest.entry(tp).or_insert(r.offset);
            *f = (*f).max(r.offset);
            read_values.insert((&r.topic, &r.value));
            if *isolation == Isolation::ReadCommitted {
                if let Some(send) = sends.get(r.value.as_str()) {
                    match fate(send.txn) {
                        Some(TxnFate::Aborted) => flag(
                            Anomaly::AbortedRead,
                            format!(
                                "{} at {}-{}@{} read by process {}, its transaction aborted",
                                r.value, r.topic, r.partition, r.offset, op.process
                            ),
                        ),
                        Some(TxnFate::Committed { asked_ms }) if op.end_ms < asked_ms => flag(
                            Anomaly::PrecommittedRead,
                            format!(
                                "{} at {}-{}@{} read by process {} by {} ms, commit asked at {asked_ms} ms",
                                r.value, r.topic, r.partition, r.offset, op.process, op.end_ms
                            ),
                        ),
                        _ => {}
                    }
                }
                if options.transform.as_ref().is_some_and(|(_, output)| *output == r.topic) {
                    let input = r.value.split('|').next().unwrap_or_default();
                    committed_output.entry(input).or_default().insert((r.partition, r.offset));
                }
            }
        }
    }

    for (((topic, partition), offset), values) in &at_offset {
        if values.len() > 1 {
            flag(Anomaly::InconsistentOffsets, format!("{topic}-{partition}@{offset} holds {values:?}"));
        }
    }
    for ((topic, value), at) in &positions {
        if at.len() > 1 {
            let at: Vec<String> = at.iter().map(|(p, o)| format!("{topic}-{p}@{o}")).collect();
            flag(Anomaly::Duplicate, format!("{value} at {}", at.join(", ")));
        }
    }

    let mut unread: Vec<(&str, &SendInfo)> = sends
        .iter()
        .filter(|(v, s)| acknowledged(s) && !read_values.contains(&(s.topic.as_str(), **v)))
        .map(|(v, s)| (*v, s))
        .collect();
    unread.sort_by_key(|(v, s)| (s.topic.clone(), s.partition, s.offset, *v));
    for (value, s) in unread {
        let offset = s.offset.unwrap_or(-1);
        let beyond = furthest.get(&(s.topic.clone(), s.partition)).is_some_and(|f| *f > offset);
        let (anomaly, why) =
            if beyond { (Anomaly::LostWrite, "reads went past it") } else { (Anomaly::Unseen, "no read reached it") };
        flag(anomaly, format!("{value} acknowledged at {}-{}@{offset}, never read; {why}", s.topic, s.partition));
    }

    // Assign-mode polls: each consumer's offsets per partition, restarted by a seek.
    let mut last: HashMap<(u32, Tp), i64> = HashMap::new();
    let mut seeked: HashMap<(u32, Tp), i64> = HashMap::new();
    for op in &history.ops {
        match &op.kind {
            OpKind::Seek { topic, partition, offset } => {
                let key = (op.process, (topic.clone(), *partition));
                last.remove(&key);
                seeked.insert(key, *offset);
            }
            OpKind::Poll { isolation, mode: Mode::Assign, records } => {
                for r in records {
                    let tp = (r.topic.clone(), r.partition);
                    let key = (op.process, tp.clone());
                    let from = match (last.get(&key), seeked.remove(&key)) {
                        (Some(prev), _) if r.offset <= *prev => {
                            flag(
                                Anomaly::NonMonotonicPoll,
                                format!(
                                    "process {} read {}-{}@{} after @{prev}",
                                    op.process, r.topic, r.partition, r.offset
                                ),
                            );
                            None
                        }
                        (Some(prev), _) => Some(prev + 1),
                        (None, Some(seek)) => Some(seek),
                        (None, None) => None,
                    };
                    if let (Some(from), Some(seen)) = (from, order.get(&(*isolation, tp))) {
                        if let Some(missed) = seen.range(from..r.offset).next() {
                            flag(
                                Anomaly::PollSkip,
                                format!(
                                    "process {} read {}-{}@{} next, skipping @{missed}",
                                    op.process, r.topic, r.partition, r.offset
                                ),
                            );
                        }
                    }
                    if last.get(&key).is_none_or(|prev| r.offset > *prev) {
                        last.insert(key, r.offset);
                    }
                }
            }
            _ => {}
        }
    }

    // Sends of one producer to one partition, in the order it made them.
    let mut by_producer: BTreeMap<(u32, &str, i32), Vec<SendTimes>> = BTreeMap::new();
    for op in &history.ops {
        if let OpKind::Send { topic, partition, outcome: Outcome::Ok, offset: Some(offset), .. } = &op.kind {
            by_producer.entry((op.process, topic, *partition)).or_default().push((op.start_ms, op.end_ms, *offset));
        }
    }
    for ((process, topic, partition), mut list) in by_producer {
        list.sort();
        for pair in list.windows(2) {
            let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
            if end <= start && b <= a {
                flag(
                    Anomaly::NonMonotonicSend,
                    format!("process {process} sent to {topic}-{partition}: @{a}, then (after it returned) @{b}"),
                );
            }
        }
    }

    // Committed offsets: a read returns at least what was acknowledged before it.
    let mut commits: HashMap<(&str, Tp), Vec<(u64, i64)>> = HashMap::new();
    for op in &history.ops {
        if let OpKind::Commit { group, topic, partition, offset, outcome: Outcome::Ok, txn } = &op.kind {
            if matches!(fate(*txn), None | Some(TxnFate::Committed { .. })) {
                commits.entry((group, (topic.clone(), *partition))).or_default().push((op.end_ms, *offset));
            }
        }
    }
    for op in &history.ops {
        if let OpKind::FetchCommitted { group, topic, partition, offset } = &op.kind {
            let before = commits.get(&(group.as_str(), (topic.clone(), *partition)));
            let floor = before.into_iter().flatten().filter(|(end, _)| *end <= op.start_ms).map(|(_, o)| *o).max();
            if let Some(floor) = floor.filter(|f| offset < f) {
                flag(
                    Anomaly::CommittedOffsetBackwards,
                    format!(
                        "group {group} {topic}-{partition}: read {offset} at {} ms, {floor} was committed before",
                        op.start_ms
                    ),
                );
            }
        }
    }

    // Last stable offsets: held in place below the HW longer than the timeout.
    if let Some(timeout) = options.txn_timeout_ms {
        let limit = timeout + options.lso_slack_ms;
        let mut held: HashMap<Tp, (i64, u64, bool)> = HashMap::new(); // lso, since, flagged
        for op in &history.ops {
            let OpKind::Lso { topic, partition, lso, hw } = &op.kind else { continue };
            let tp = (topic.clone(), *partition);
            if lso >= hw {
                held.remove(&tp);
                continue;
            }
            let entry = held.entry(tp).or_insert((*lso, op.end_ms, false));
            if entry.0 != *lso {
                *entry = (*lso, op.end_ms, false);
            } else if !entry.2 && op.start_ms.saturating_sub(entry.1) > limit {
                entry.2 = true;
                flag(
                    Anomaly::LsoStuck,
                    format!("{topic}-{partition}: LSO {lso} below HW {hw} from {} ms to {} ms", entry.1, op.start_ms),
                );
            }
        }
    }

    if let Some((input, _)) = &options.transform {
        let mut inputs: Vec<&str> =
            sends.iter().filter(|(_, s)| s.topic == *input && acknowledged(s)).map(|(v, _)| *v).collect();
        inputs.sort();
        for value in &inputs {
            match committed_output.get(value).map_or(0, |at| at.len()) {
                1 => {}
                0 => flag(Anomaly::TransformNotExactlyOnce, format!("input {value} is not in the committed output")),
                n => flag(
                    Anomaly::TransformNotExactlyOnce,
                    format!("input {value} is in the committed output {n} times"),
                ),
            }
        }
        for value in committed_output.keys() {
            if inputs.binary_search(value).is_err() {
                flag(Anomaly::TransformNotExactlyOnce, format!("output {value} has no acknowledged input"));
            }
        }
    }

    report.stats = stats;
    report
}
