//! Eligible leader replicas (KIP-966, on as in a new Kafka 4.1 cluster),
//! as functions of a partition's registration: no I/O, called by
//! [`super::core`] for every change it makes to a partition.
//!
//! Why they exist: without fsync, a replica that loses power loses its
//! unflushed tail. Kafka without ELR keeps the last ISR member in the ISR
//! even when it dies, so after a power loss of that member followed by the
//! fencing of the others it can come back, lead, and make every follower
//! truncate to the tail it lost.
//!
//! The rules (Kafka's `PartitionChangeBuilder`):
//! - While the ISR is at least `min.insync.replicas`, the ELR is empty.
//! - Below it the high watermark stands still, so every replica that
//!   leaves the ISR from then on still holds everything committed: it
//!   joins the ELR, unless it is leaving because it restarted after an
//!   unclean shutdown (it may have lost its tail). Such a restart also
//!   removes the broker from every ELR it is in.
//! - With ELR the ISR may empty (the last member leaves into the ELR).
//!   Only then may an ELR member lead; elected, it becomes the whole ISR.
//! - A partition whose ISR empties remembers its last leader (the "last
//!   known ELR") until it has a leader again; if neither ISR nor ELR has
//!   anyone left, that replica is elected as an unclean election would
//!   (what Kafka 4.1 does, so a single-replica topic is not offline for
//!   good after a crash).
//! - An unclean election clears both lists.

use crate::metadata::image::{PartitionRegistration, NO_LEADER};

use super::reassignment::ReplicaChange;

/// The ELR a change may elect from, before its election: the replicas in
/// the ELR or the current ISR that leave (or stay out of) the new ISR
/// `isr`, less the unclean-shutdown ones, while `isr` is below `min_isr`.
pub fn candidates(
    reg: &PartitionRegistration,
    isr: &[i32],
    replicas: &[i32],
    min_isr: usize,
    unclean_shutdown: &[i32],
) -> Vec<i32> {
    if isr.len() >= min_isr {
        return Vec::new();
    }
    let mut elr: Vec<i32> = Vec::new();
    for &r in reg.elr.iter().chain(reg.isr.iter()) {
        if !isr.contains(&r) && !unclean_shutdown.contains(&r) && replicas.contains(&r) && !elr.contains(&r) {
            elr.push(r);
        }
    }
    elr
}

/// `change` to `reg` with the ELR and last known ELR it leaves, each set
/// only when it differs from the registration's. `unclean_election` when
/// the change elects a replica from outside ISR and ELR.
pub fn complete(
    reg: &PartitionRegistration,
    mut change: ReplicaChange,
    min_isr: usize,
    unclean_shutdown: &[i32],
    unclean_election: bool,
) -> ReplicaChange {
    let leader = change.leader.unwrap_or(reg.leader);
    let isr = change.isr.clone().unwrap_or_else(|| reg.isr.clone());
    let replicas = change.assignment.as_ref().map_or(&reg.replicas, |a| &a.replicas);
    let (elr, last_known) = if unclean_election {
        (Vec::new(), Vec::new())
    } else {
        let elr = candidates(reg, &isr, replicas, min_isr, unclean_shutdown);
        let last_known = if isr.is_empty() && !reg.isr.is_empty() {
            // The ISR empties: remember who led last (an image from before
            // ELR may hold a lone ISR member without a leader).
            let last = if reg.leader != NO_LEADER {
                Some(reg.leader)
            } else {
                reg.isr.first().copied().filter(|_| reg.isr.len() == 1)
            };
            last.map_or_else(|| reg.last_known_elr.clone(), |l| vec![l])
        } else if leader != NO_LEADER {
            Vec::new()
        } else {
            reg.last_known_elr.clone()
        };
        let last_known = last_known.into_iter().filter(|r| replicas.contains(r)).collect();
        (elr, last_known)
    };
    change.elr = (elr != reg.elr).then_some(elr);
    change.last_known_elr = (last_known != reg.last_known_elr).then_some(last_known);
    change
}

/// Whether `replica` may lead with `isr` as the new ISR and `elr` its ELR
/// candidates: an ISR member, or an ELR member once the ISR is empty.
pub fn may_lead(replica: i32, isr: &[i32], elr: &[i32]) -> bool {
    isr.contains(&replica) || (isr.is_empty() && elr.contains(&replica))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(replicas: &[i32], isr: &[i32], leader: i32, elr: &[i32], lke: &[i32]) -> PartitionRegistration {
        PartitionRegistration {
            elr: elr.to_vec(),
            last_known_elr: lke.to_vec(),
            ..PartitionRegistration::new(replicas, isr, leader)
        }
    }

    fn isr_change(isr: &[i32], leader: Option<i32>) -> ReplicaChange {
        ReplicaChange { leader, isr: Some(isr.to_vec()), ..Default::default() }
    }

    #[test]
    fn replicas_leaving_an_isr_below_min_isr_become_eligible() {
        let r = reg(&[1, 2, 3], &[1, 2, 3], 1, &[], &[]);
        // Still at min ISR 2: nothing is eligible.
        let c = complete(&r, isr_change(&[1, 2], None), 2, &[], false);
        assert_eq!(c.elr, None);
        // Below it: the leavers are.
        let c = complete(&r, isr_change(&[1], None), 2, &[], false);
        assert_eq!(c.elr, Some(vec![2, 3]));
        // Back at min ISR: cleared.
        let shrunk = reg(&[1, 2, 3], &[1], 1, &[2, 3], &[]);
        assert_eq!(complete(&shrunk, isr_change(&[1, 2], None), 2, &[], false).elr, Some(vec![]));
    }

    #[test]
    fn an_unclean_shutdown_leaves_no_eligibility_and_an_empty_partition_remembers_its_leader() {
        let r = reg(&[1, 2, 3], &[3], 3, &[1], &[]);
        // 3 is fenced: it joins 1 in the ELR, the ISR empties.
        let c = complete(&r, isr_change(&[], Some(NO_LEADER)), 2, &[], false);
        assert_eq!((c.elr.clone(), c.last_known_elr.clone()), (Some(vec![1, 3]), Some(vec![3])));
        // 3 restarted after a crash: out of the ELR.
        let empty = reg(&[1, 2, 3], &[], NO_LEADER, &[1, 3], &[3]);
        let c = complete(&empty, ReplicaChange::default(), 2, &[3], false);
        assert_eq!((c.elr, c.last_known_elr), (Some(vec![1]), None));
        // The last ISR member crashes: only the last leader is remembered.
        let r = reg(&[1, 2, 3], &[1], 1, &[], &[]);
        let c = complete(&r, isr_change(&[], Some(NO_LEADER)), 2, &[1], false);
        assert_eq!((c.elr, c.last_known_elr), (None, Some(vec![1])));
        // A leader again clears it.
        let lost = reg(&[1, 2, 3], &[], NO_LEADER, &[], &[1]);
        let c = complete(&lost, isr_change(&[1], Some(1)), 2, &[], true);
        assert_eq!(c.last_known_elr, Some(vec![]));
    }

    #[test]
    fn only_an_empty_isr_lets_the_elr_lead() {
        assert!(may_lead(2, &[2], &[1]));
        assert!(!may_lead(1, &[2], &[1]));
        assert!(may_lead(1, &[], &[1]));
        assert!(!may_lead(3, &[], &[1]));
    }
}
