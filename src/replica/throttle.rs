//! Replication throttles, as Kafka's (KIP-73): what `kafka-reassign-partitions
//! --throttle` sets so that moving a replica does not take the whole link.
//!
//! - Topic keys `leader.replication.throttled.replicas` and
//!   `follower.replication.throttled.replicas` name the throttled replicas:
//!   `*` (all) or `partition:broker,...`.
//! - Broker keys `leader.replication.throttled.rate` and
//!   `follower.replication.throttled.rate` (bytes/s, dynamic, this broker's
//!   or the cluster default) bound the replication bytes of those replicas:
//!   a leader serving throttled followers, a follower fetching throttled
//!   partitions.
//!
//! As in Kafka, a replica in the ISR is never held back (throttling it could
//! stall acks=all produce), but its bytes count towards the rate. When a
//! quota is used up, the leader answers a throttled partition with no
//! records (the follower's position is still recorded) and the follower
//! leaves it out of its next fetch, until the quota refills.
//!
//! The quota is a token bucket refilled at the rate and holding at most
//! one second of it, so the bytes moved over any period stay within about
//! one second's worth of `rate x period`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use uuid::Uuid;

use crate::metadata::image::ClusterImage;

pub const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
pub const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";
pub const LEADER_RATE: &str = "leader.replication.throttled.rate";
pub const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";
/// No throttle: Kafka's default rate (Long.MAX_VALUE).
pub const UNLIMITED: u64 = i64::MAX as u64;

/// The replicas a throttled-replicas value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottledReplicas {
    All,
    /// (partition, broker) pairs.
    Listed(BTreeSet<(i32, i32)>),
}

impl ThrottledReplicas {
    /// Parses `*`, an empty list, or `partition:broker` pairs separated by
    /// commas (spaces allowed), as Kafka's ThrottledReplicaListValidator.
    pub fn parse(value: &str) -> Result<ThrottledReplicas, String> {
        let v = value.trim();
        if v == "*" {
            return Ok(ThrottledReplicas::All);
        }
        let mut listed = BTreeSet::new();
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let pair = item.split_once(':').and_then(|(p, b)| Some((p.trim().parse().ok()?, b.trim().parse().ok()?)));
            match pair {
                Some((p, b)) if p >= 0 && b >= 0 => {
                    listed.insert((p, b));
                }
                _ => {
                    return Err(format!(
                        "{item:?}: must be the wildcard (*) or a list of [PartitionId]:[BrokerId] pairs"
                    ))
                }
            }
        }
        Ok(ThrottledReplicas::Listed(listed))
    }

    /// The value written back: `*` or the sorted pairs.
    pub fn normalised(&self) -> String {
        match self {
            ThrottledReplicas::All => "*".into(),
            ThrottledReplicas::Listed(l) => l.iter().map(|(p, b)| format!("{p}:{b}")).collect::<Vec<_>>().join(","),
        }
    }

    pub fn contains(&self, partition: i32, broker: i32) -> bool {
        match self {
            ThrottledReplicas::All => true,
            ThrottledReplicas::Listed(l) => l.contains(&(partition, broker)),
        }
    }
}

/// Validates a throttle rate: bytes per second, 0 or more (as Kafka).
pub fn parse_rate(value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|r| *r >= 0)
        .map(|r| r as u64)
        .ok_or_else(|| format!("{value:?}: a replication throttle rate is a number of bytes per second, 0 or more"))
}

/// A byte rate bound: a token bucket of at most one second of the rate.
#[derive(Debug)]
pub struct Quota {
    rate: AtomicU64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes that may still go; below zero after a read larger than what was left.
    tokens: f64,
    refilled: Instant,
}

impl Quota {
    pub fn new(rate: u64) -> Quota {
        Quota {
            rate: AtomicU64::new(rate),
            bucket: Mutex::new(Bucket { tokens: rate as f64, refilled: Instant::now() }),
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, rate: u64) {
        if self.rate.swap(rate, Ordering::Relaxed) != rate {
            let mut b = self.lock();
            b.tokens = b.tokens.min(rate as f64);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.bucket.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let rate = self.rate() as f64;
        let elapsed = now.saturating_duration_since(b.refilled).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(rate);
        b.refilled = now;
    }

    /// Whether the bytes recorded have used up the quota for now.
    pub fn exceeded(&self, now: Instant) -> bool {
        if self.rate() >= UNLIMITED {
            return false;
        }
        let mut b = self.lock();
        self.refill(&mut b, now);
        b.tokens <= 0.0
    }

    /// Counts `bytes` of throttled replication against the quota.
    pub fn record(&self, bytes: usize, now: Instant) {
        if bytes == 0 || self.rate() >= UNLIMITED {
            return;
        }
        let mut b = self.lock();
        self.refill(&mut b, now);
        b.tokens -= bytes as f64;
    }
}

/// One topic's throttled replicas, leader side and follower side.
#[derive(Debug, Clone, Default)]
struct TopicThrottle {
    leader: Option<ThrottledReplicas>,
    follower: Option<ThrottledReplicas>,
}

/// This broker's replication throttles, refreshed from each metadata image.
#[derive(Debug)]
pub struct Throttles {
    me: i32,
    pub leader: Quota,
    pub follower: Quota,
    topics: RwLock<HashMap<Uuid, TopicThrottle>>,
}

impl Throttles {
    pub fn new(me: i32) -> Throttles {
        Throttles { me, leader: Quota::new(UNLIMITED), follower: Quota::new(UNLIMITED), topics: RwLock::default() }
    }

    /// Takes the rates (this broker's, else the cluster default, else none)
    /// and every topic's throttled replicas from `image`. Values were
    /// validated when they were set; one that does not parse throttles nothing.
    pub fn apply_image(&self, image: &ClusterImage) {
        let rate = |key: &str| {
            image
                .broker_configs
                .get(&self.me)
                .and_then(|c| c.get(key))
                .or_else(|| image.broker_default_configs.get(key))
                .and_then(|v| parse_rate(v).ok())
                .unwrap_or(UNLIMITED)
        };
        self.leader.set_rate(rate(LEADER_RATE));
        self.follower.set_rate(rate(FOLLOWER_RATE));
        let mut topics = HashMap::new();
        for (name, configs) in &image.topic_configs {
            let parse = |key: &str| configs.get(key).and_then(|v| ThrottledReplicas::parse(v).ok());
            let t = TopicThrottle { leader: parse(LEADER_REPLICAS), follower: parse(FOLLOWER_REPLICAS) };
            if t.leader.is_none() && t.follower.is_none() {
                continue;
            }
            if let Some(id) = image.topic_ids.get(name) {
                topics.insert(*id, t);
            }
        }
        *self.topics.write().unwrap_or_else(|e| e.into_inner()) = topics;
    }

    fn topic(&self, topic_id: &Uuid) -> Option<TopicThrottle> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).get(topic_id).cloned()
    }

    /// Leader side: whether `replica`'s copy of the partition is throttled here.
    pub fn leader_throttles(&self, topic_id: &Uuid, partition: i32, replica: i32) -> bool {
        self.leader.rate() < UNLIMITED
            && self.topic(topic_id).and_then(|t| t.leader).is_some_and(|r| r.contains(partition, replica))
    }

    /// Follower side: whether this broker's copy of the partition is throttled.
    pub fn follower_throttles(&self, topic_id: &Uuid, partition: i32) -> bool {
        self.follower.rate() < UNLIMITED
            && self.topic(topic_id).and_then(|t| t.follower).is_some_and(|r| r.contains(partition, self.me))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn throttled_replica_lists_parse_as_kafka_writes_them() {
        assert_eq!(ThrottledReplicas::parse("*").unwrap(), ThrottledReplicas::All);
        let l = ThrottledReplicas::parse("0:1, 0:2,1:3").unwrap();
        assert!(l.contains(0, 2) && l.contains(1, 3) && !l.contains(1, 1));
        assert_eq!(l.normalised(), "0:1,0:2,1:3");
        assert_eq!(ThrottledReplicas::parse("").unwrap(), ThrottledReplicas::Listed(BTreeSet::new()));
        for bad in ["0", "a:1", "0:1:2", "-1:2", "*,0:1"] {
            assert!(ThrottledReplicas::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_rate("-1").is_err() && parse_rate("x").is_err());
        assert_eq!(parse_rate(" 1000 ").unwrap(), 1000);
    }

    #[test]
    fn a_quota_lets_through_its_rate_and_one_second_of_burst() {
        let q = Quota::new(1000);
        let t0 = Instant::now();
        assert!(!q.exceeded(t0));
        q.record(1500, t0);
        assert!(q.exceeded(t0));
        // 500 bytes owed: refilled after half a second.
        assert!(q.exceeded(t0 + Duration::from_millis(400)));
        assert!(!q.exceeded(t0 + Duration::from_millis(600)));
        // Idle for long: no more than one second's worth saved up.
        let later = t0 + Duration::from_secs(60);
        assert!(!q.exceeded(later));
        q.record(1001, later);
        assert!(q.exceeded(later));
        // Unlimited never throttles; lowering the rate caps what was saved.
        let u = Quota::new(UNLIMITED);
        u.record(usize::MAX, t0);
        assert!(!u.exceeded(t0));
        u.set_rate(10);
        u.record(11, t0);
        assert!(u.exceeded(t0));
    }
}
