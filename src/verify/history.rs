//! What a fault-injection run did, as the checker reads it: every client
//! operation with its start and end time (milliseconds since the run
//! began), who did it (`process`, one per client instance) and how it ended.
//! Stored as JSON lines, one operation per line, so a history outlives the
//! run that made it and can be checked again (`History::read`).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// How an operation ended. `Unknown` is an operation whose effect cannot be
/// known (a timeout, a connection lost after sending): the checker allows
/// both outcomes for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Failed,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

/// How a consumer got its partitions: `Assign` consumers read each
/// partition in order from where they were told (`Seek`), so their polls
/// must be monotonic and skip nothing; `Subscribe` consumers may be moved
/// by rebalances and are not held to that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Assign,
    Subscribe,
}

/// One record a poll returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Read {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// A produce of one unique `value`; `offset` is the acknowledged offset
    /// (`Ok` only). `txn` names the transaction it belongs to, if any.
    Send {
        topic: String,
        partition: i32,
        value: String,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        txn: Option<u64>,
    },
    /// The end of transaction `txn` (unique in the history): a commit or an
    /// abort, and how that call ended.
    EndTxn { txn: u64, commit: bool, outcome: Outcome },
    /// One poll's records, in the order the client returned them.
    Poll { isolation: Isolation, mode: Mode, records: Vec<Read> },
    /// The consumer's position on a partition was set (assignment, seek,
    /// restart): the next poll there starts a new sequence.
    Seek { topic: String, partition: i32, offset: i64 },
    /// An offset commit for a group (`OffsetCommit` or, inside a
    /// transaction, `TxnOffsetCommit`: then it counts only if `txn` commits).
    Commit {
        group: String,
        topic: String,
        partition: i32,
        offset: i64,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        txn: Option<u64>,
    },
    /// A read of a group's committed offset (`OffsetFetch`); -1 for none.
    FetchCommitted { group: String, topic: String, partition: i32, offset: i64 },
    /// An observation of a partition's last stable offset and high
    /// watermark (ListOffsets read_committed and read_uncommitted latest).
    Lso { topic: String, partition: i32, lso: i64, hw: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub process: u32,
    pub start_ms: u64,
    pub end_ms: u64,
    #[serde(flatten)]
    pub kind: OpKind,
}

/// Every operation of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
}

impl History {
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// One JSON object per line.
    pub fn write(&self, mut out: impl Write) -> std::io::Result<()> {
        for op in &self.ops {
            serde_json::to_writer(&mut out, op)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// Reads what [`History::write`] wrote; an error names the bad line.
    pub fn read(input: impl BufRead) -> Result<History, String> {
        let mut ops = Vec::new();
        for (n, line) in input.lines().enumerate() {
            let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
            if line.trim().is_empty() {
                continue;
            }
            ops.push(serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", n + 1))?);
        }
        Ok(History { ops })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_reads_back_what_was_written() {
        let mut h = History::default();
        h.push(Op {
            process: 1,
            start_ms: 5,
            end_ms: 9,
            kind: OpKind::Send {
                topic: "t".into(),
                partition: 2,
                value: "1-7".into(),
                outcome: Outcome::Ok,
                offset: Some(40),
                txn: Some(3),
            },
        });
        h.push(Op {
            process: 2,
            start_ms: 10,
            end_ms: 11,
            kind: OpKind::Poll {
                isolation: Isolation::ReadCommitted,
                mode: Mode::Assign,
                records: vec![Read { topic: "t".into(), partition: 2, offset: 40, value: "1-7".into() }],
            },
        });
        h.push(Op {
            process: 1,
            start_ms: 12,
            end_ms: 20,
            kind: OpKind::EndTxn { txn: 3, commit: true, outcome: Outcome::Ok },
        });
        let mut buf = Vec::new();
        h.write(&mut buf).unwrap();
        assert_eq!(History::read(&buf[..]).unwrap(), h);
        let err = History::read(&b"{\"process\":1}\n"[..]).unwrap_err();
        assert!(err.starts_with("line 1:"), "{err}");
    }
}
