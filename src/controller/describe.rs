//! What DescribeQuorum reports: the metadata log's leader, its high
//! watermark and how far each voter has replicated, as the active
//! controller sees them.
//!
//! Offsets are raft log indexes given as Kafka gives log offsets: a log end
//! offset is one past the last entry a replica holds, the high watermark one
//! past the last committed entry. Timestamps are wall-clock milliseconds,
//! -1 when never seen.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumDescription {
    pub leader_id: i32,
    /// The raft term, which is what KRaft calls the leader epoch.
    pub leader_epoch: i32,
    pub high_watermark: i64,
    pub voters: Vec<ReplicaDescription>,
    /// Nodes that follow the log without voting; none while every broker is
    /// also a controller.
    pub observers: Vec<ReplicaDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDescription {
    pub replica_id: i32,
    pub log_end_offset: i64,
    pub last_fetch_ms: i64,
    pub last_caught_up_ms: i64,
}

/// When the leader last heard from one follower, and when that follower last
/// held everything the leader held.
#[derive(Debug, Clone, Copy, Default)]
pub struct FollowerContact {
    pub last_fetch_ms: Option<i64>,
    pub last_caught_up_ms: Option<i64>,
}

impl FollowerContact {
    /// A response from the follower arrived at `now_ms`; `caught_up` says
    /// whether its matched index has reached the leader's last index.
    pub fn heard(&mut self, now_ms: i64, caught_up: bool) {
        self.last_fetch_ms = Some(now_ms);
        if caught_up {
            self.last_caught_up_ms = Some(now_ms);
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contact_records_fetch_and_catch_up_separately() {
        let mut c = FollowerContact::default();
        c.heard(10, false);
        assert_eq!((c.last_fetch_ms, c.last_caught_up_ms), (Some(10), None));
        c.heard(20, true);
        c.heard(30, false);
        assert_eq!((c.last_fetch_ms, c.last_caught_up_ms), (Some(30), Some(20)));
    }
}
