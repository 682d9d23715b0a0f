//! Verification of what clients saw: a [`history::History`] of operations
//! recorded by a workload (the fault-injection tests, `strand verify`) and
//! the [`checker`] that finds Jepsen's Kafka anomalies in it.

pub mod checker;
pub mod history;

pub use checker::{check, Anomaly, CheckOptions, Report};
pub use history::{History, Isolation, Mode, Op, OpKind, Outcome, Read};

#[cfg(test)]
mod tests {
    //! One history per anomaly class, each with the anomaly and nothing
    //! else: the checker must flag exactly that class.
    use super::*;

    fn op(process: u32, start_ms: u64, end_ms: u64, kind: OpKind) -> Op {
        Op { process, start_ms, end_ms, kind }
    }

    fn send(process: u32, at: u64, partition: i32, value: &str, offset: i64) -> Op {
        sent(process, at, partition, value, Outcome::Ok, Some(offset), None)
    }

    fn sent(
        process: u32,
        at: u64,
        partition: i32,
        value: &str,
        outcome: Outcome,
        offset: Option<i64>,
        txn: Option<u64>,
    ) -> Op {
        let kind = OpKind::Send { topic: "t".into(), partition, value: value.into(), outcome, offset, txn };
        op(process, at, at + 1, kind)
    }

    fn poll(process: u32, at: u64, isolation: Isolation, records: &[(i32, i64, &str)]) -> Op {
        poll_topic(process, at, isolation, "t", records)
    }

    fn poll_topic(process: u32, at: u64, isolation: Isolation, topic: &str, records: &[(i32, i64, &str)]) -> Op {
        let records = records
            .iter()
            .map(|(p, o, v)| Read { topic: topic.into(), partition: *p, offset: *o, value: (*v).into() })
            .collect();
        op(process, at, at + 1, OpKind::Poll { isolation, mode: Mode::Assign, records })
    }

    fn end_txn(process: u32, at: u64, txn: u64, commit: bool) -> Op {
        op(process, at, at + 1, OpKind::EndTxn { txn, commit, outcome: Outcome::Ok })
    }

    const RU: Isolation = Isolation::ReadUncommitted;
    const RC: Isolation = Isolation::ReadCommitted;

    /// Checks `ops` and returns the classes flagged, with their counts.
    fn flagged(ops: Vec<Op>, options: &CheckOptions) -> Vec<(Anomaly, usize)> {
        let report = check(&History { ops }, options);
        Anomaly::ALL.iter().map(|a| (*a, report.count(*a))).filter(|(_, n)| *n > 0).collect()
    }

    fn only(ops: Vec<Op>, anomaly: Anomaly) {
        assert_eq!(
            flagged(ops, &CheckOptions::default()),
            vec![(anomaly, 1)],
            "expected exactly one {}",
            anomaly.name()
        );
    }

    #[test]
    fn a_clean_history_has_no_anomaly() {
        let ops = vec![
            send(1, 0, 0, "a", 0),
            send(1, 2, 0, "b", 1),
            sent(2, 3, 1, "c", Outcome::Unknown, None, None),
            sent(2, 4, 1, "d", Outcome::Failed, None, None),
            sent(3, 5, 0, "x", Outcome::Ok, Some(2), Some(1)),
            end_txn(3, 6, 1, false),
            sent(3, 8, 0, "y", Outcome::Ok, Some(4), Some(2)),
            end_txn(3, 9, 2, true),
            poll(4, 10, RU, &[(0, 0, "a"), (0, 1, "b"), (0, 2, "x"), (0, 4, "y")]),
            poll(5, 10, RC, &[(0, 0, "a"), (0, 1, "b"), (0, 4, "y"), (1, 0, "c")]),
        ];
        let report = check(&History { ops }, &CheckOptions::default());
        assert!(report.is_clean(), "{}", report.table());
        assert_eq!((report.stats.sends, report.stats.acknowledged, report.stats.txns_committed), (6, 3, 1));
    }

    #[test]
    fn lost_write() {
        only(vec![send(1, 0, 0, "a", 0), send(1, 2, 0, "b", 1), poll(2, 5, RU, &[(0, 1, "b")])], Anomaly::LostWrite);
    }

    #[test]
    fn unseen() {
        only(vec![send(1, 0, 0, "a", 0), send(1, 2, 0, "b", 1), poll(2, 5, RU, &[(0, 0, "a")])], Anomaly::Unseen);
    }

    #[test]
    fn duplicate() {
        only(
            vec![
                send(1, 0, 0, "a", 0),
                send(1, 2, 0, "b", 1),
                poll(2, 5, RU, &[(0, 0, "a"), (0, 1, "b"), (0, 2, "a")]),
            ],
            Anomaly::Duplicate,
        );
    }

    #[test]
    fn inconsistent_offsets() {
        // An unacknowledged write may be anywhere, but not where another value is.
        only(
            vec![
                send(1, 0, 0, "a", 0),
                sent(1, 2, 0, "b", Outcome::Unknown, None, None),
                poll(2, 5, RU, &[(0, 0, "a")]),
                poll(3, 5, RU, &[(0, 0, "b")]),
            ],
            Anomaly::InconsistentOffsets,
        );
    }

    #[test]
    fn aborted_read() {
        only(
            vec![
                sent(1, 0, 0, "a", Outcome::Ok, Some(0), Some(7)),
                end_txn(1, 2, 7, false),
                poll(2, 5, RU, &[(0, 0, "a")]),
                poll(3, 5, RC, &[(0, 0, "a")]),
            ],
            Anomaly::AbortedRead,
        );
        // A transaction that never ended was never committed.
        only(
            vec![sent(1, 0, 0, "a", Outcome::Ok, Some(0), Some(7)), poll(3, 5, RC, &[(0, 0, "a")])],
            Anomaly::AbortedRead,
        );
    }

    #[test]
    fn precommitted_read() {
        only(
            vec![
                sent(1, 0, 0, "a", Outcome::Ok, Some(0), Some(7)),
                poll(3, 3, RC, &[(0, 0, "a")]),
                end_txn(1, 10, 7, true),
            ],
            Anomaly::PrecommittedRead,
        );
    }

    #[test]
    fn poll_skip() {
        let ops = vec![
            send(1, 0, 0, "a", 0),
            send(1, 2, 0, "b", 1),
            send(1, 4, 0, "c", 2),
            poll(2, 5, RU, &[(0, 0, "a"), (0, 1, "b"), (0, 2, "c")]),
            poll(3, 5, RU, &[(0, 0, "a")]),
            poll(3, 6, RU, &[(0, 2, "c")]),
        ];
        only(ops, Anomaly::PollSkip);
        // After a seek the first read must be the first offset at or past it.
        let ops = vec![
            send(1, 0, 0, "a", 0),
            send(1, 2, 0, "b", 1),
            poll(2, 5, RU, &[(0, 0, "a"), (0, 1, "b")]),
            op(3, 6, 6, OpKind::Seek { topic: "t".into(), partition: 0, offset: 0 }),
            poll(3, 7, RU, &[(0, 1, "b")]),
        ];
        only(ops, Anomaly::PollSkip);
    }

    #[test]
    fn nonmonotonic_poll() {
        let ops = vec![
            send(1, 0, 0, "a", 0),
            send(1, 2, 0, "b", 1),
            poll(3, 5, RU, &[(0, 0, "a"), (0, 1, "b")]),
            poll(3, 6, RU, &[(0, 1, "b")]),
        ];
        only(ops, Anomaly::NonMonotonicPoll);
        // A seek in between makes reading again expected.
        let ops = vec![
            send(1, 0, 0, "a", 0),
            poll(3, 5, RU, &[(0, 0, "a")]),
            op(3, 6, 6, OpKind::Seek { topic: "t".into(), partition: 0, offset: 0 }),
            poll(3, 7, RU, &[(0, 0, "a")]),
        ];
        assert_eq!(flagged(ops, &CheckOptions::default()), vec![]);
    }

    #[test]
    fn nonmonotonic_send() {
        let ops = vec![send(1, 0, 0, "a", 1), send(1, 2, 0, "b", 0), poll(2, 5, RU, &[(0, 0, "b"), (0, 1, "a")])];
        only(ops, Anomaly::NonMonotonicSend);
        // Sends in flight together may land in either order.
        let ops = vec![
            op(
                1,
                0,
                5,
                OpKind::Send {
                    topic: "t".into(),
                    partition: 0,
                    value: "a".into(),
                    outcome: Outcome::Ok,
                    offset: Some(1),
                    txn: None,
                },
            ),
            op(
                1,
                1,
                5,
                OpKind::Send {
                    topic: "t".into(),
                    partition: 0,
                    value: "b".into(),
                    outcome: Outcome::Ok,
                    offset: Some(0),
                    txn: None,
                },
            ),
            poll(2, 6, RU, &[(0, 0, "b"), (0, 1, "a")]),
        ];
        assert_eq!(flagged(ops, &CheckOptions::default()), vec![]);
    }

    fn commit(at: u64, offset: i64, txn: Option<u64>) -> Op {
        let kind =
            OpKind::Commit { group: "g".into(), topic: "t".into(), partition: 0, offset, outcome: Outcome::Ok, txn };
        op(1, at, at + 1, kind)
    }

    fn fetch_committed(at: u64, offset: i64) -> Op {
        op(2, at, at + 1, OpKind::FetchCommitted { group: "g".into(), topic: "t".into(), partition: 0, offset })
    }

    #[test]
    fn committed_offset_backwards() {
        only(vec![commit(0, 5, None), commit(2, 9, None), fetch_committed(4, 5)], Anomaly::CommittedOffsetBackwards);
        // An offset committed in a transaction that aborted does not count.
        let ops = vec![commit(0, 5, None), commit(2, 9, Some(3)), end_txn(1, 3, 3, false), fetch_committed(5, 5)];
        assert_eq!(flagged(ops, &CheckOptions::default()), vec![]);
    }

    fn lso(at: u64, lso: i64, hw: i64) -> Op {
        op(9, at, at + 1, OpKind::Lso { topic: "t".into(), partition: 0, lso, hw })
    }

    #[test]
    fn lso_stuck() {
        let options = CheckOptions { txn_timeout_ms: Some(1000), lso_slack_ms: 500, transform: None };
        let stuck = vec![lso(0, 3, 10), lso(800, 3, 12), lso(1600, 3, 12), lso(2000, 3, 14)];
        assert_eq!(flagged(stuck, &options), vec![(Anomaly::LsoStuck, 1)]);
        let moving = vec![lso(0, 3, 10), lso(800, 3, 12), lso(1400, 12, 14), lso(2000, 12, 16), lso(2600, 16, 16)];
        assert_eq!(flagged(moving, &options), vec![]);
    }

    #[test]
    fn transform_not_exactly_once() {
        let options = CheckOptions { transform: Some(("t".into(), "out".into())), ..CheckOptions::default() };
        let base = || {
            vec![
                send(1, 0, 0, "a", 0),
                send(1, 2, 0, "b", 1),
                send(1, 4, 0, "c", 2),
                poll(2, 5, RC, &[(0, 0, "a"), (0, 1, "b"), (0, 2, "c")]),
            ]
        };
        let mut exact = base();
        exact.push(poll_topic(3, 9, RC, "out", &[(0, 0, "a|1"), (0, 1, "b|1"), (0, 3, "c|2")]));
        assert_eq!(flagged(exact, &options), vec![]);
        let mut missing = base();
        missing.push(poll_topic(3, 9, RC, "out", &[(0, 0, "a"), (0, 1, "b")]));
        assert_eq!(flagged(missing, &options), vec![(Anomaly::TransformNotExactlyOnce, 1)]);
        // Twice in the output is also a duplicate there.
        let mut twice = base();
        twice.push(poll_topic(3, 9, RC, "out", &[(0, 0, "a"), (0, 1, "b"), (0, 2, "c"), (0, 4, "a")]));
        assert_eq!(flagged(twice, &options), vec![(Anomaly::Duplicate, 1), (Anomaly::TransformNotExactlyOnce, 1)]);
        // Two attempts' outputs of one input, both committed.
        let mut retried = base();
        retried.push(poll_topic(3, 9, RC, "out", &[(0, 0, "a|1"), (0, 1, "b|1"), (0, 2, "c|1"), (0, 4, "a|2")]));
        assert_eq!(flagged(retried, &options), vec![(Anomaly::TransformNotExactlyOnce, 1)]);
        // An output nobody asked for.
        let mut stray = base();
        stray.push(poll_topic(3, 9, RC, "out", &[(0, 0, "a"), (0, 1, "b"), (0, 2, "c"), (0, 3, "z|1")]));
        assert_eq!(flagged(stray, &options), vec![(Anomaly::TransformNotExactlyOnce, 1)]);
    }
}
