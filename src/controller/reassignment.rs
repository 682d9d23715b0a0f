//! Partition reassignment decisions (KIP-455, as Kafka's KRaft controller
//! makes them), as functions of a partition's registration: they do no I/O
//! and are called by [`super::core`].
//!
//! A reassignment to `target` makes the partition's replicas the target
//! followed by the current replicas not in it (those being removed); the
//! target replicas not yet replicas are being added. They join the ISR as
//! any follower does (the leader's AlterPartition once caught up), and the
//! change that puts the last target replica in the ISR also completes the
//! reassignment: replicas become the target, the ISR loses the removed
//! ones, and a leader being removed hands over to the first target replica
//! of the ISR. So the new replicas have caught up before an old one goes,
//! and no step leaves the partition without an ISR member to lead.

use serde::{Deserialize, Serialize};

use crate::metadata::image::{LeaderRecoveryState, PartitionRegistration, NO_LEADER};
use crate::metadata::records::Assignment;

/// The leader, ISR and replica set a reassignment step changes to, each
/// `None` when unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaChange {
    pub leader: Option<i32>,
    pub isr: Option<Vec<i32>>,
    pub assignment: Option<Assignment>,
    /// Set by [`super::eligible::complete`] for every change.
    pub elr: Option<Vec<i32>>,
    pub last_known_elr: Option<Vec<i32>>,
    /// RECOVERING when the change is an unclean election (KIP-704), or the
    /// state an AlterPartition asks for; `None`: unchanged.
    pub leader_recovery_state: Option<LeaderRecoveryState>,
}

/// One partition's outcome of an AlterPartitionReassignments request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentResult {
    pub topic: String,
    pub partition: i32,
    pub outcome: Result<(), ReassignmentError>,
}

/// Why a partition's reassignment (or its cancellation) was refused;
/// Kafka's per-partition codes at the API edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ReassignmentError {
    #[error("no partition {0}-{1}")]
    UnknownTopicOrPartition(String, i32),
    #[error("invalid replica assignment {replicas:?}: {why}")]
    InvalidAssignment { replicas: Vec<i32>, why: String },
    #[error(
        "the reassignment changes the replication factor from {current} to {target}, which the request does not allow"
    )]
    ReplicationFactorChange { current: usize, target: usize },
    #[error("no reassignment of the partition is in progress")]
    NoReassignmentInProgress,
    #[error("cancelling would leave no in-sync replica among the original replicas {original:?}")]
    CannotRevert { original: Vec<i32> },
    #[error("another change to the partition committed first; retry")]
    Overtaken,
}

/// The change that starts (or replaces) a reassignment of `reg` to
/// `target`, completed at once when the ISR already holds every target
/// replica (a reordering, or only removals). `registered` tells whether a
/// broker id is registered; `active` whether it may lead.
pub fn start(
    reg: &PartitionRegistration,
    target: &[i32],
    allow_factor_change: bool,
    registered: impl Fn(i32) -> bool,
    active: impl Fn(i32) -> bool,
) -> Result<ReplicaChange, ReassignmentError> {
    let invalid = |why: String| ReassignmentError::InvalidAssignment { replicas: target.to_vec(), why };
    if target.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if target.iter().enumerate().any(|(i, b)| target[..i].contains(b)) {
        return Err(invalid("it lists a broker twice".into()));
    }
    if let Some(b) = target.iter().find(|b| **b < 0 || !registered(**b)) {
        return Err(invalid(format!("broker {b} is not registered")));
    }
    let original = reg.original_replicas();
    if !allow_factor_change && target.len() != original.len() {
        return Err(ReassignmentError::ReplicationFactorChange { current: original.len(), target: target.len() });
    }
    // As Kafka: relative to the replicas now listed (a replica an earlier
    // reassignment was adding and this one drops is removed like any other).
    let removing: Vec<i32> = reg.replicas.iter().copied().filter(|r| !target.contains(r)).collect();
    let adding: Vec<i32> = target.iter().copied().filter(|r| !reg.replicas.contains(r)).collect();
    let replicas: Vec<i32> = target.iter().copied().chain(removing.iter().copied()).collect();
    let next = PartitionRegistration {
        replicas: replicas.clone(),
        adding_replicas: adding.clone(),
        removing_replicas: removing.clone(),
        ..reg.clone()
    };
    match completion(&next, &reg.isr, &active) {
        Some(done) => Ok(done),
        None => Ok(ReplicaChange { assignment: Some(Assignment { replicas, adding, removing }), ..Default::default() }),
    }
}

/// The change that completes `reg`'s reassignment once its ISR is `isr`
/// (every target replica in it), or `None` if it cannot complete yet:
/// replicas become the target, the ISR keeps its target members, a leader
/// not in the target gives way to the first active target replica of the
/// ISR (and the reassignment waits if there is none).
pub fn completion(reg: &PartitionRegistration, isr: &[i32], active: impl Fn(i32) -> bool) -> Option<ReplicaChange> {
    if !reg.is_reassigning() {
        return None;
    }
    let target = reg.target_replicas();
    if !target.iter().all(|r| isr.contains(r)) {
        return None;
    }
    let new_isr: Vec<i32> = target.clone();
    let leader = if reg.leader == NO_LEADER || target.contains(&reg.leader) {
        reg.leader
    } else {
        target.iter().copied().find(|r| active(*r))?
    };
    Some(ReplicaChange {
        leader: (leader != reg.leader).then_some(leader),
        isr: (new_isr != reg.isr).then_some(new_isr),
        assignment: Some(Assignment { replicas: target, adding: Vec::new(), removing: Vec::new() }),
        ..Default::default()
    })
}

/// The change that cancels `reg`'s reassignment: back to the replicas it
/// had, the ISR without the replicas that were being added, and a leader
/// among those if it was one being added.
pub fn cancel(reg: &PartitionRegistration, active: impl Fn(i32) -> bool) -> Result<ReplicaChange, ReassignmentError> {
    if !reg.is_reassigning() {
        return Err(ReassignmentError::NoReassignmentInProgress);
    }
    let original = reg.original_replicas();
    let isr: Vec<i32> = reg.isr.iter().copied().filter(|r| original.contains(r)).collect();
    if isr.is_empty() {
        return Err(ReassignmentError::CannotRevert { original });
    }
    let leader = if reg.leader == NO_LEADER || original.contains(&reg.leader) {
        reg.leader
    } else {
        original.iter().copied().find(|r| isr.contains(r) && active(*r)).unwrap_or(NO_LEADER)
    };
    Ok(ReplicaChange {
        leader: (leader != reg.leader).then_some(leader),
        isr: (isr != reg.isr).then_some(isr),
        assignment: Some(Assignment { replicas: original, adding: Vec::new(), removing: Vec::new() }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(replicas: &[i32], isr: &[i32], leader: i32) -> PartitionRegistration {
        PartitionRegistration::new(replicas, isr, leader)
    }

    fn applied(reg: &PartitionRegistration, change: &ReplicaChange) -> PartitionRegistration {
        let mut next = reg.clone();
        if let Some(a) = &change.assignment {
            next.replicas = a.replicas.clone();
            next.adding_replicas = a.adding.clone();
            next.removing_replicas = a.removing.clone();
        }
        if let Some(isr) = &change.isr {
            next.isr = isr.clone();
        }
        if let Some(l) = change.leader {
            next.leader = l;
        }
        next.check().expect("a reassignment step keeps the registration valid");
        next
    }

    const ALL: fn(i32) -> bool = |_| true;

    #[test]
    fn a_move_adds_first_and_removes_once_the_new_replica_is_in_sync() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 1);
        let started = applied(&r, &start(&r, &[4, 2, 3], true, ALL, ALL).unwrap());
        assert_eq!(started.replicas, vec![4, 2, 3, 1]);
        assert_eq!((started.adding_replicas.as_slice(), started.removing_replicas.as_slice()), (&[4][..], &[1][..]));
        assert_eq!((started.isr.as_slice(), started.leader), (&[1, 2, 3][..], 1), "nothing leaves before 4 is in sync");
        assert_eq!(completion(&started, &[1, 2, 3], ALL), None);
        let done = applied(&started, &completion(&started, &[1, 2, 3, 4], ALL).unwrap());
        assert_eq!((done.replicas.as_slice(), done.isr.as_slice()), (&[4, 2, 3][..], &[4, 2, 3][..]));
        assert_eq!(done.leader, 4, "the removed leader hands over to the first target replica in the ISR");
        assert!(!done.is_reassigning());
    }

    #[test]
    fn removals_and_reorderings_complete_at_once() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 2);
        let shrunk = applied(&r, &start(&r, &[3, 2], true, ALL, ALL).unwrap());
        assert_eq!((shrunk.replicas.as_slice(), shrunk.isr.as_slice(), shrunk.leader), (&[3, 2][..], &[3, 2][..], 2));
        let reordered = applied(&r, &start(&r, &[3, 1, 2], true, ALL, ALL).unwrap());
        assert_eq!(reordered.replicas, vec![3, 1, 2]);
        assert!(!reordered.is_reassigning());
        // A removal waits while a target replica is out of sync.
        let lagging = reg(&[1, 2, 3], &[1, 2], 1);
        let waiting = applied(&lagging, &start(&lagging, &[2, 3], true, ALL, ALL).unwrap());
        assert_eq!(waiting.removing_replicas, vec![1]);
    }

    #[test]
    fn requests_are_checked_as_kafka_checks_them() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 1);
        let registered = |b: i32| b <= 4;
        let invalid =
            |t: &[i32]| matches!(start(&r, t, true, registered, ALL), Err(ReassignmentError::InvalidAssignment { .. }));
        assert!(invalid(&[]));
        assert!(invalid(&[1, 1, 2]));
        assert!(invalid(&[1, 2, 9]));
        assert!(invalid(&[-1, 2, 3]));
        assert_eq!(
            start(&r, &[1, 2], false, registered, ALL),
            Err(ReassignmentError::ReplicationFactorChange { current: 3, target: 2 })
        );
        assert_eq!(cancel(&r, ALL), Err(ReassignmentError::NoReassignmentInProgress));
    }

    #[test]
    fn cancelling_goes_back_to_the_original_replicas() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 1);
        let started = applied(&r, &start(&r, &[4, 5, 6], true, ALL, ALL).unwrap());
        // 4 caught up and joined; 5 and 6 not yet.
        let joined = PartitionRegistration { isr: vec![1, 2, 3, 4], ..started };
        let back = applied(&joined, &cancel(&joined, ALL).unwrap());
        assert_eq!((back.replicas.as_slice(), back.isr.as_slice(), back.leader), (&[1, 2, 3][..], &[1, 2, 3][..], 1));
        assert!(!back.is_reassigning());
    }

    #[test]
    fn a_new_reassignment_replaces_the_one_in_progress() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 1);
        let first = applied(&r, &start(&r, &[4, 2, 3], true, ALL, ALL).unwrap());
        let second = applied(&first, &start(&first, &[5, 2, 3], true, ALL, ALL).unwrap());
        assert_eq!(second.replicas, vec![5, 2, 3, 4, 1]);
        assert_eq!((second.adding_replicas.as_slice(), second.removing_replicas.as_slice()), (&[5][..], &[4, 1][..]));
        let done = applied(&second, &completion(&second, &[1, 2, 3, 5], ALL).unwrap());
        assert_eq!((done.replicas.as_slice(), done.leader), (&[5, 2, 3][..], 5));
    }
}
