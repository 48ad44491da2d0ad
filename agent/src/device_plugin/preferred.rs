//! `GetPreferredAllocation`: which of the available GPUs a container should get.
//!
//! An allocation that fits on one NUMA node is kept there, else one that fits on one socket is
//! kept on that socket; among the nodes (sockets) that fit, the one with the fewest available
//! GPUs is chosen (the tightest fit leaves the larger groups whole for larger requests), ties to
//! the lowest id. GPUs that must be included are always in it, and the group must hold them
//! all. When nothing fits in one group, the allocation starts in the groups of the GPUs it must
//! include and then takes the groups with the most available GPUs. The answer is a pure
//! function of its inputs, in minor order.

use std::collections::BTreeMap;

use mockgpu_api::Gpu;

/// A preferred-allocation request that cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreferError {
    /// IDs that are none of this node's GPUs.
    #[error("unknown device IDs: {}", .0.join(", "))]
    Unknown(Vec<String>),
    /// IDs that must be included but are not available.
    #[error("device IDs to include are not available: {}", .0.join(", "))]
    NotAvailable(Vec<String>),
    /// The size is smaller than the GPUs to include or larger than the GPUs available.
    #[error(
        "allocation size {size} is not between {must} (GPUs to include) and {available} (GPUs available)"
    )]
    Size {
        /// The size asked for.
        size: i64,
        /// GPUs to include.
        must: usize,
        /// GPUs available.
        available: usize,
    },
}

/// The preferred `size` GPUs among `available` (UUIDs of `gpus`), with every one of
/// `must_include`.
pub fn preferred(
    gpus: &[Gpu],
    available: &[String],
    must_include: &[String],
    size: i64,
) -> Result<Vec<String>, PreferError> {
    let lookup = |ids: &[String]| -> Result<Vec<&Gpu>, PreferError> {
        let unknown: Vec<String> = ids
            .iter()
            .filter(|id| !gpus.iter().any(|g| &g.uuid == *id))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(PreferError::Unknown(unknown));
        }
        let mut found: Vec<&Gpu> = gpus.iter().filter(|g| ids.contains(&g.uuid)).collect();
        found.sort_by_key(|g| g.minor);
        Ok(found)
    };
    let available = lookup(available)?;
    let must = lookup(must_include)?;
    let missing: Vec<String> = must
        .iter()
        .filter(|g| !available.iter().any(|a| a.uuid == g.uuid))
        .map(|g| g.uuid.clone())
        .collect();
    if !missing.is_empty() {
        return Err(PreferError::NotAvailable(missing));
    }
    if size < must.len() as i64 || size > available.len() as i64 {
        return Err(PreferError::Size {
            size,
            must: must.len(),
            available: available.len(),
        });
    }
    let size = size as usize;
    let chosen = [numa_node, socket]
        .iter()
        .find_map(|key| within_one_group(&available, &must, size, *key))
        .unwrap_or_else(|| spread(&available, &must, size, socket));
    let mut ids: Vec<(u32, String)> = chosen.iter().map(|g| (g.minor, g.uuid.clone())).collect();
    ids.sort();
    Ok(ids.into_iter().map(|(_, id)| id).collect())
}

/// How GPUs are grouped: `None` puts a GPU in no group.
type Key = fn(&Gpu) -> Option<u32>;

/// The GPU's NUMA node, when it has one.
fn numa_node(g: &Gpu) -> Option<u32> {
    u32::try_from(g.numa_node).ok()
}

/// The GPU's socket.
fn socket(g: &Gpu) -> Option<u32> {
    Some(g.socket)
}

/// The available GPUs grouped by `key`, each group in minor order.
fn groups<'a>(available: &[&'a Gpu], key: Key) -> BTreeMap<u32, Vec<&'a Gpu>> {
    let mut groups: BTreeMap<u32, Vec<&Gpu>> = BTreeMap::new();
    for g in available {
        if let Some(id) = key(g) {
            groups.entry(id).or_default().push(g);
        }
    }
    groups
}

/// `must` plus the first GPUs of the tightest group that holds `must` and `size` GPUs.
fn within_one_group<'a>(
    available: &[&'a Gpu],
    must: &[&'a Gpu],
    size: usize,
    key: Key,
) -> Option<Vec<&'a Gpu>> {
    let (_, members) = groups(available, key)
        .into_iter()
        .filter(|(id, members)| members.len() >= size && must.iter().all(|g| key(g) == Some(*id)))
        .min_by_key(|(id, members)| (members.len(), *id))?;
    Some(fill(must.to_vec(), members, size))
}

/// `must`, then the groups (by `key`) of `must`, then the largest groups, until `size` GPUs.
fn spread<'a>(available: &[&'a Gpu], must: &[&'a Gpu], size: usize, key: Key) -> Vec<&'a Gpu> {
    let mut order: Vec<(u32, Vec<&Gpu>)> = groups(available, key).into_iter().collect();
    // Stable: equal ranks keep id order.
    order.sort_by_key(|(id, members)| {
        let holds_must = must.iter().any(|g| key(g) == Some(*id));
        (!holds_must, std::cmp::Reverse(members.len()))
    });
    let mut chosen = must.to_vec();
    for (_, members) in order {
        chosen = fill(chosen, members, size);
    }
    chosen
}

/// `chosen` extended by `candidates` not yet in it, up to `size`.
fn fill<'a>(mut chosen: Vec<&'a Gpu>, candidates: Vec<&'a Gpu>, size: usize) -> Vec<&'a Gpu> {
    for g in candidates {
        if chosen.len() >= size {
            break;
        }
        if !chosen.iter().any(|c| c.uuid == g.uuid) {
            chosen.push(g);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use mockgpu_api::{BusId, CpuSet};

    use super::*;

    /// GPUs by (socket, NUMA node), minors in order; UUIDs are `g<minor>`.
    fn gpus(layout: &[(u32, i32)]) -> Vec<Gpu> {
        layout
            .iter()
            .enumerate()
            .map(|(i, &(socket, numa_node))| Gpu {
                index: i as u32,
                minor: i as u32,
                uuid: format!("g{i}"),
                bus_id: BusId {
                    domain: 0,
                    bus: i as u8 + 1,
                    slot: 0,
                    function: 0,
                },
                irq: 0,
                socket,
                numa_node,
                cpus: CpuSet::from_ids(0..1),
            })
            .collect()
    }

    fn ids(list: &[u32]) -> Vec<String> {
        list.iter().map(|i| format!("g{i}")).collect()
    }

    /// (available, must include, size) -> preferred, by minor.
    type Case = (&'static [u32], &'static [u32], i64, &'static [u32]);

    /// Two sockets, two NUMA nodes each, two GPUs per NUMA node.
    fn eight() -> Vec<Gpu> {
        gpus(&[
            (0, 0),
            (0, 0),
            (0, 1),
            (0, 1),
            (1, 2),
            (1, 2),
            (1, 3),
            (1, 3),
        ])
    }

    #[test]
    fn allocations_stay_on_one_numa_node_then_one_socket() {
        let g = eight();
        let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
        let cases: &[Case] = &[
            // Two fit on NUMA node 0, the first node.
            (&[0, 1, 2, 3, 4, 5, 6, 7], &[], 2, &[0, 1]),
            // Node 0 has one left: node 1 has two.
            (&[1, 2, 3, 4, 5, 6, 7], &[], 2, &[2, 3]),
            // The tightest fit: node 0, with one left, before the nodes with two.
            (&[0, 2, 3, 4, 5, 6, 7], &[], 1, &[0]),
            // Four do not fit a NUMA node but fit socket 1.
            (&[0, 1, 3, 4, 5, 6, 7], &[], 4, &[4, 5, 6, 7]),
            // Must include GPU 5: NUMA node 2.
            (&[0, 1, 2, 3, 4, 5, 6, 7], &[5], 2, &[4, 5]),
            // Must include 1 and 6: no group holds both; their groups first.
            (&[0, 1, 2, 3, 4, 5, 6, 7], &[1, 6], 3, &[0, 1, 6]),
            // Five fit no socket: a whole socket first.
            (&[0, 1, 2, 3, 4, 5, 6, 7], &[], 5, &[0, 1, 2, 3, 4]),
            (&[0, 1, 2, 3, 4, 5, 6, 7], &[], 8, &[0, 1, 2, 3, 4, 5, 6, 7]),
        ];
        for (available, must, size, want) in cases {
            let got = preferred(&g, &ids(available), &ids(must), *size).unwrap();
            assert_eq!(
                got,
                ids(want),
                "available {available:?} must {must:?} size {size}"
            );
        }
        // Deterministic whatever the order of the request's lists.
        let mut shuffled = all.clone();
        shuffled.reverse();
        assert_eq!(preferred(&g, &shuffled, &[], 2).unwrap(), ids(&[0, 1]));
    }

    #[test]
    fn without_numa_the_socket_decides() {
        let g = gpus(&[(0, -1), (0, -1), (1, -1), (1, -1)]);
        // No NUMA node: the socket of GPU 2.
        assert_eq!(
            preferred(&g, &ids(&[1, 2, 3]), &ids(&[2]), 2).unwrap(),
            ids(&[2, 3])
        );
        // One NUMA node across both sockets: the NUMA node decides first.
        let g = gpus(&[(0, 0), (0, 0), (1, 0), (1, 0)]);
        assert_eq!(
            preferred(&g, &ids(&[0, 1, 2, 3]), &ids(&[2]), 2).unwrap(),
            ids(&[0, 2])
        );
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let g = eight();
        let e = preferred(&g, &["g1".into(), "GPU-x".into()], &[], 1).unwrap_err();
        assert_eq!(e.to_string(), "unknown device IDs: GPU-x");
        let e = preferred(&g, &ids(&[0, 1]), &ids(&[2]), 2).unwrap_err();
        assert_eq!(e.to_string(), "device IDs to include are not available: g2");
        let e = preferred(&g, &ids(&[0, 1]), &[], 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "allocation size 3 is not between 0 (GPUs to include) and 2 (GPUs available)"
        );
        assert!(preferred(&g, &ids(&[0, 1]), &ids(&[0, 1]), 1).is_err());
        assert!(preferred(&g, &ids(&[0, 1]), &[], -1).is_err());
    }
}
