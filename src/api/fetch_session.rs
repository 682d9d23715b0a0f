//! Incremental fetch sessions (KIP-227).
//!
//! A client that opens a session (session id 0, epoch 0) sends its full
//! partition list once; later requests (same id, next epoch) carry only
//! changes, and responses carry only partitions with something new: records,
//! an error, or a moved high watermark, last stable offset or log start.
//! Partitions that returned data move to the back of the session's order so
//! that a busy partition cannot starve the others of the response byte budget.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use uuid::Uuid;

/// How a partition's topic is named in the session: by name before Fetch v13, by id after.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicKey {
    Name(String),
    Id(Uuid),
}

pub type PartitionKey = (TopicKey, i32);

/// What the session remembers of one partition.
#[derive(Debug, Clone)]
pub struct CachedPartition {
    pub fetch_offset: i64,
    pub max_bytes: i32,
    /// Last values sent, to decide whether an incremental response must include the partition.
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

impl CachedPartition {
    pub fn new(fetch_offset: i64, max_bytes: i32) -> Self {
        CachedPartition { fetch_offset, max_bytes, high_watermark: -1, last_stable_offset: -1, log_start_offset: -1 }
    }
}

#[derive(Debug)]
struct Session {
    /// Epoch the next request must carry.
    next_epoch: i32,
    partitions: IndexMap<PartitionKey, CachedPartition>,
    last_used: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionError {
    NotFound,
    InvalidEpoch,
}

/// How this request relates to sessions.
#[derive(Debug)]
pub enum SessionPlan {
    /// No session: fetch the request's partitions, answer with session id 0.
    Sessionless,
    /// Full fetch that (re)creates session `id` (0 if the cache is full).
    Full { id: i32 },
    /// Incremental fetch in session `id`: fetch `partitions`, include only changed ones.
    Incremental { id: i32, partitions: Vec<(PartitionKey, CachedPartition)> },
}

pub struct FetchSessionCache {
    sessions: HashMap<i32, Session>,
    slots: usize,
    next_id: i32,
    idle_timeout: Duration,
}

fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl FetchSessionCache {
    pub fn new(slots: usize) -> Self {
        FetchSessionCache { sessions: HashMap::new(), slots, next_id: 1, idle_timeout: Duration::from_secs(120) }
    }

    fn new_session_id(&mut self) -> i32 {
        loop {
            let id = self.next_id;
            self.next_id = if self.next_id == i32::MAX { 1 } else { self.next_id + 1 };
            if !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    fn evict_idle(&mut self, now: Instant) {
        let timeout = self.idle_timeout;
        self.sessions.retain(|_, s| now.duration_since(s.last_used) < timeout);
    }

    /// Decides how to serve a request and applies its partition changes to the session.
    /// `requested` are the partitions the request names; `forgotten` those it drops.
    pub fn plan(
        &mut self,
        session_id: i32,
        epoch: i32,
        requested: &[(PartitionKey, CachedPartition)],
        forgotten: &[PartitionKey],
    ) -> Result<SessionPlan, SessionError> {
        let now = Instant::now();
        const FINAL_EPOCH: i32 = -1;
        const INITIAL_EPOCH: i32 = 0;
        match (session_id, epoch) {
            (0, FINAL_EPOCH) => Ok(SessionPlan::Sessionless),
            (id, FINAL_EPOCH) => {
                self.sessions.remove(&id);
                Ok(SessionPlan::Sessionless)
            }
            (id, INITIAL_EPOCH) => {
                if id != 0 {
                    self.sessions.remove(&id);
                }
                self.evict_idle(now);
                if self.sessions.len() >= self.slots {
                    return Ok(SessionPlan::Full { id: 0 });
                }
                let new_id = self.new_session_id();
                let partitions = requested.iter().cloned().collect();
                self.sessions.insert(new_id, Session { next_epoch: 1, partitions, last_used: now });
                Ok(SessionPlan::Full { id: new_id })
            }
            (0, _) => Err(SessionError::NotFound),
            (id, epoch) => {
                let session = self.sessions.get_mut(&id).ok_or(SessionError::NotFound)?;
                if session.next_epoch != epoch {
                    return Err(SessionError::InvalidEpoch);
                }
                session.next_epoch = next_epoch(epoch);
                session.last_used = now;
                for key in forgotten {
                    session.partitions.shift_remove(key);
                }
                for (key, update) in requested {
                    match session.partitions.get_mut(key) {
                        Some(cached) => {
                            cached.fetch_offset = update.fetch_offset;
                            cached.max_bytes = update.max_bytes;
                        }
                        None => {
                            session.partitions.insert(key.clone(), update.clone());
                        }
                    }
                }
                let partitions = session.partitions.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                Ok(SessionPlan::Incremental { id, partitions })
            }
        }
    }

    /// Records what a response sent for `key` in session `id`; `had_data` moves it to the back.
    pub fn record_sent(&mut self, id: i32, key: &PartitionKey, hw: i64, lso: i64, log_start: i64, had_data: bool) {
        let Some(session) = self.sessions.get_mut(&id) else { return };
        let Some(index) = session.partitions.get_index_of(key) else { return };
        if let Some((_, cached)) = session.partitions.get_index_mut(index) {
            cached.high_watermark = hw;
            cached.last_stable_offset = lso;
            cached.log_start_offset = log_start;
        }
        if had_data {
            let last = session.partitions.len() - 1;
            session.partitions.move_index(index, last);
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, p: i32) -> PartitionKey {
        (TopicKey::Name(name.into()), p)
    }

    #[test]
    fn session_lifecycle_follows_kip_227() {
        let mut cache = FetchSessionCache::new(10);
        let req = vec![(key("a", 0), CachedPartition::new(0, 100)), (key("a", 1), CachedPartition::new(5, 100))];
        let SessionPlan::Full { id } = cache.plan(0, 0, &req, &[]).unwrap() else { panic!() };
        assert_ne!(id, 0);
        // Incremental: epoch 1 with no changes fetches both cached partitions.
        let SessionPlan::Incremental { partitions, .. } = cache.plan(id, 1, &[], &[]).unwrap() else { panic!() };
        assert_eq!(partitions.len(), 2);
        // Wrong epoch is refused; forgetting a partition removes it.
        assert_eq!(cache.plan(id, 1, &[], &[]).unwrap_err(), SessionError::InvalidEpoch);
        let SessionPlan::Incremental { partitions, .. } = cache.plan(id, 2, &[], &[key("a", 0)]).unwrap() else {
            panic!()
        };
        assert_eq!(partitions.len(), 1);
        assert_eq!(cache.plan(999, 1, &[], &[]).unwrap_err(), SessionError::NotFound);
        // Closing.
        assert!(matches!(cache.plan(id, -1, &[], &[]).unwrap(), SessionPlan::Sessionless));
        assert!(cache.is_empty());
    }

    #[test]
    fn full_cache_gives_session_zero() {
        let mut cache = FetchSessionCache::new(1);
        assert!(matches!(cache.plan(0, 0, &[], &[]).unwrap(), SessionPlan::Full { id } if id != 0));
        assert!(matches!(cache.plan(0, 0, &[], &[]).unwrap(), SessionPlan::Full { id: 0 }));
    }

    #[test]
    fn partitions_with_data_rotate_to_the_back() {
        let mut cache = FetchSessionCache::new(10);
        let req = vec![(key("a", 0), CachedPartition::new(0, 100)), (key("a", 1), CachedPartition::new(0, 100))];
        let SessionPlan::Full { id } = cache.plan(0, 0, &req, &[]).unwrap() else { panic!() };
        cache.record_sent(id, &key("a", 0), 10, 10, 0, true);
        let SessionPlan::Incremental { partitions, .. } = cache.plan(id, 1, &[], &[]).unwrap() else { panic!() };
        assert_eq!(partitions[0].0, key("a", 1));
        assert_eq!(partitions[1].1.high_watermark, 10);
    }
}
