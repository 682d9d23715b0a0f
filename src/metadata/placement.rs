//! Replica placement for new partitions, as Kafka places them.
//!
//! Brokers are ordered so that consecutive brokers sit on different racks
//! (rack A's first, rack B's first, ..., rack A's second, ...), then
//! partition `p`'s first replica (its preferred leader) is broker
//! `(start + p) mod n` of that order and its other replicas follow at a
//! shift that grows every `n` partitions, so leaders are spread evenly and
//! followers do not all pile onto the leader's neighbour. With racks, a
//! partition's replicas land on distinct racks while there are racks left.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PlacementError {
    #[error("replication factor {factor} is larger than the {brokers} available brokers")]
    ReplicationFactorTooLarge { factor: i16, brokers: usize },
    #[error("replication factor must be at least 1, got {0}")]
    ReplicationFactorTooSmall(i16),
    /// A manual assignment that cannot be used, with why.
    #[error("invalid replica assignment: {0}")]
    InvalidAssignment(String),
}

/// Checks the shape of a manual assignment (each partition's replicas, in
/// partition order): at least one partition; each partition's replicas
/// non-empty, distinct and `registered`; all partitions the same size, and
/// that size `factor` when given (partitions added to a topic).
pub fn check_assignment(
    assignment: &[Vec<i32>],
    factor: Option<usize>,
    registered: impl Fn(i32) -> bool,
) -> Result<(), PlacementError> {
    let invalid = |m: String| Err(PlacementError::InvalidAssignment(m));
    let Some(first) = assignment.first() else { return invalid("no partitions are assigned".into()) };
    let size = factor.unwrap_or(first.len());
    for (p, replicas) in assignment.iter().enumerate() {
        if replicas.is_empty() {
            return invalid(format!("partition {p} has no replicas"));
        }
        if replicas.len() != size {
            return invalid(format!("partition {p} has {} replicas where every partition has {size}", replicas.len()));
        }
        let mut distinct = replicas.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != replicas.len() {
            return invalid(format!("partition {p} lists a broker twice: {replicas:?}"));
        }
        if let Some(b) = replicas.iter().find(|b| !registered(**b)) {
            return invalid(format!("partition {p} is assigned to broker {b}, which is not registered"));
        }
    }
    Ok(())
}

/// A broker that may be given replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i32,
    pub rack: Option<String>,
}

/// Replicas for `partitions` new partitions, numbered from `first_partition`
/// (CreatePartitions continues an existing topic). `start` picks the broker
/// of the first preferred leader; callers pass something that differs
/// between topics (Kafka picks it at random), so topics do not all start on
/// the same broker.
pub fn place(
    candidates: &[Candidate],
    first_partition: i32,
    partitions: i32,
    factor: i16,
    start: usize,
) -> Result<Vec<Vec<i32>>, PlacementError> {
    if factor < 1 {
        return Err(PlacementError::ReplicationFactorTooSmall(factor));
    }
    let n = candidates.len();
    if factor as usize > n {
        return Err(PlacementError::ReplicationFactorTooLarge { factor, brokers: n });
    }
    let order = rack_alternating(candidates);
    let racks = |ids: &[i32]| -> Vec<Option<String>> {
        ids.iter().map(|id| candidates.iter().find(|c| c.id == *id).and_then(|c| c.rack.clone())).collect()
    };
    let distinct_racks = {
        let mut r: Vec<_> = candidates.iter().map(|c| c.rack.clone()).collect();
        r.sort();
        r.dedup();
        r.len()
    };
    let mut out = Vec::with_capacity(partitions as usize);
    for i in 0..partitions as usize {
        let p = first_partition as usize + i;
        let first = (start + p) % n;
        // The follower shift changes every n partitions (never 0).
        let shift = if n > 1 { 1 + (start + p / n) % (n - 1) } else { 0 };
        let mut replicas = vec![order[first]];
        let mut k = 0;
        while replicas.len() < factor as usize {
            // Prefer a broker on a rack this partition does not use yet, while racks remain.
            let mut pick = None;
            for step in 0..n {
                let idx = (first + shift + k + step) % n;
                let id = order[idx];
                if replicas.contains(&id) {
                    continue;
                }
                let used = racks(&replicas);
                let rack = racks(&[id]).pop().flatten();
                let rack_is_new = !used.contains(&rack);
                if rack_is_new || used.len() >= distinct_racks {
                    pick = Some((id, step));
                    break;
                }
                if pick.is_none() {
                    pick = Some((id, step)); // fallback: any broker not yet used
                }
            }
            let (id, step) = pick.expect("factor <= brokers leaves a broker to pick");
            replicas.push(id);
            k += step + 1;
        }
        out.push(replicas);
    }
    Ok(out)
}

/// Brokers ordered so that neighbours sit on different racks where possible.
fn rack_alternating(candidates: &[Candidate]) -> Vec<i32> {
    let mut by_rack: BTreeMap<Option<String>, Vec<i32>> = BTreeMap::new();
    for c in candidates {
        by_rack.entry(c.rack.clone()).or_default().push(c.id);
    }
    for ids in by_rack.values_mut() {
        ids.sort();
    }
    let mut order = Vec::with_capacity(candidates.len());
    let mut round = 0;
    while order.len() < candidates.len() {
        for ids in by_rack.values() {
            if let Some(id) = ids.get(round) {
                order.push(*id);
            }
        }
        round += 1;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(spec: &[(i32, Option<&str>)]) -> Vec<Candidate> {
        spec.iter().map(|(id, r)| Candidate { id: *id, rack: r.map(String::from) }).collect()
    }

    #[test]
    fn leaders_and_replicas_spread_evenly() {
        let c = brokers(&[(1, None), (2, None), (3, None)]);
        for start in 0..3 {
            let placed = place(&c, 0, 30, 3, start).unwrap();
            let mut leaders = BTreeMap::new();
            for r in &placed {
                assert_eq!(r.len(), 3);
                let mut d = r.clone();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), 3, "distinct replicas {r:?}");
                *leaders.entry(r[0]).or_insert(0) += 1;
            }
            assert_eq!(leaders.values().copied().collect::<Vec<_>>(), vec![10, 10, 10], "start {start}");
        }
        let single = place(&c, 0, 3, 1, 0).unwrap();
        assert_eq!(single, vec![vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn replicas_land_on_distinct_racks() {
        let c = brokers(&[(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b")), (5, Some("c"))]);
        for p in place(&c, 0, 20, 3, 1).unwrap() {
            let racks: std::collections::BTreeSet<_> =
                p.iter().map(|id| c.iter().find(|b| b.id == *id).unwrap().rack.clone()).collect();
            assert_eq!(racks.len(), 3, "{p:?} on racks {racks:?}");
        }
    }

    #[test]
    fn too_large_a_factor_is_refused() {
        let c = brokers(&[(1, None), (2, None)]);
        assert_eq!(place(&c, 0, 1, 3, 0), Err(PlacementError::ReplicationFactorTooLarge { factor: 3, brokers: 2 }));
        assert_eq!(place(&c, 0, 1, 0, 0), Err(PlacementError::ReplicationFactorTooSmall(0)));
    }
}
