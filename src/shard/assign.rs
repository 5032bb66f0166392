//! Which replica owns which shard: a pure function of the group's name, its shard count and
//! its live members, so every replica computes the same assignment from the same view; and
//! the stable hash that maps a key to its shard.

use crate::util::{fnv1a64, fnv1a64_from};

/// splitmix64's finalizer: spreads FNV's weak low bits over the whole word, so rendezvous
/// weights of similar inputs are independent.
fn mix(z: u64) -> u64 {
    crate::util::splitmix(z)
}

/// The shard of `key` among `shards`: FNV-1a 64 of the key's UTF-8 bytes, modulo `shards`.
///
/// Stable across versions and easy to compute in any language, so other programs can route
/// work to the replica that owns it. Test vectors: with 32 shards, `""` → 5, `"a"` → 12,
/// `"default/my-config"` → 26. `shards` of 0 is treated as 1.
///
/// # Example
///
/// ```
/// assert_eq!(tenure::shard::shard_of("a", 32), 12);
/// ```
#[must_use]
pub fn shard_of(key: &str, shards: u32) -> u32 {
    let n = u64::from(shards.max(1));
    // The remainder is below `shards`, a u32.
    u32::try_from(fnv1a64(key.as_bytes()) % n).unwrap_or(0)
}

/// Rendezvous weights of one shard: how much each member wants `shard` of group `group`,
/// `mix(FNV-1a(group ‖ 0xff ‖ shard as 4 big-endian bytes ‖ 0xff ‖ member))`. The hash of
/// the shard's prefix is computed once, not once per member and comparison: the assignment
/// weighs every unowned shard against every member with room, on every replica, at every
/// membership change (the cost that grows with shards × members).
#[derive(Clone, Copy)]
struct ShardWeights(u64);

impl ShardWeights {
    fn new(group_prefix: u64, shard: u32) -> Self {
        let h = fnv1a64_from(group_prefix, &shard.to_be_bytes());
        Self(fnv1a64_from(h, &[0xff]))
    }

    fn of(self, member: &str) -> u64 {
        mix(fnv1a64_from(self.0, member.as_bytes()))
    }
}

/// The hash of `group ‖ 0xff`, where every weight of the group starts.
fn group_prefix(group: &str) -> u64 {
    fnv1a64_from(fnv1a64(group.as_bytes()), &[0xff])
}

/// One live member as the assignment sees it: its identity and the shards whose term runs
/// there now (as its membership record announces them).
#[derive(Clone, Copy, Debug)]
pub struct Seat<'a> {
    /// The member's identity.
    pub identity: &'a str,
    /// The shards it announces it holds.
    pub holds: &'a [u32],
}

/// The owner of each shard `0..shards`, as an index into `members`: every member owns
/// `⌊shards / members⌋` or one more (balanced to ±1), and as few shards as possible change
/// hands from what the members hold now.
///
/// 1. Capacities: every member may own `⌊N/M⌋`; the `N mod M` members ranked highest by a
///    hash of the group and their identity may own one more. They depend on the member set
///    only, so a join lowers capacities and a leave raises them, never the other way round.
/// 2. Each member keeps the shards it holds, up to its capacity. Over it (after a join), it
///    keeps those it weighs most (rendezvous weights) and gives up the rest. A shard two
///    members claim (a hand-off in progress) stays with the first in rank order.
/// 3. Every shard left — given up, held by a member that left, never held — goes, in shard
///    order, to the member with room that weighs it most.
///
/// So a leave moves exactly the leaver's shards, and a join exactly the shards the newcomer
/// takes; and the rule is stable while a hand-off is under way: a member that gives a shard
/// up has no room for it afterwards, and one that takes a shard it was assigned keeps it.
///
/// `members` must be sorted by identity and free of duplicates (the backends' member lists
/// are). Empty `members` own nothing: every entry is `None`. Shards held outside
/// `0..shards` are ignored.
#[must_use]
pub fn assign(group: &str, shards: u32, members: &[Seat<'_>]) -> Vec<Option<usize>> {
    let n = shards as usize;
    let m = members.len();
    if m == 0 {
        return vec![None; n];
    }
    let group_hash = fnv1a64(group.as_bytes());
    let prefix = group_prefix(group);
    let mut by_rank: Vec<usize> = (0..m).collect();
    by_rank.sort_by_key(|&i| {
        (
            std::cmp::Reverse(mix(fnv1a64(members[i].identity.as_bytes()) ^ group_hash)),
            i,
        )
    });
    let (base, extra) = (n / m, n % m);
    let mut room = vec![base; m];
    for &i in by_rank.iter().take(extra) {
        room[i] += 1;
    }
    let mut owner: Vec<Option<usize>> = vec![None; n];
    for &i in &by_rank {
        let mut held: Vec<u32> = members[i]
            .holds
            .iter()
            .copied()
            .filter(|&s| (s as usize) < n && owner[s as usize].is_none())
            .collect();
        held.sort_unstable();
        held.dedup();
        // Cached: one weight per held shard, not one per comparison (the sort is stable, as
        // `sort_by_key` is, so the order is the same).
        held.sort_by_cached_key(|&s| {
            std::cmp::Reverse(ShardWeights::new(prefix, s).of(members[i].identity))
        });
        for s in held.into_iter().take(room[i]) {
            owner[s as usize] = Some(i);
            room[i] -= 1;
        }
    }
    for (s, slot) in owner.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        let shard = u32::try_from(s).unwrap_or(u32::MAX);
        let weights = ShardWeights::new(prefix, shard);
        // Some member has room: the capacities add up to `n`, and this shard is not yet owned.
        *slot = (0..m)
            .filter(|&i| room[i] > 0)
            .max_by_key(|&i| (weights.of(members[i].identity), std::cmp::Reverse(i)));
        if let Some(i) = *slot {
            room[i] -= 1;
        }
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_matches_the_documented_vectors() {
        assert_eq!(shard_of("", 32), 5);
        assert_eq!(shard_of("a", 32), 12);
        assert_eq!(shard_of("default/my-config", 32), 26);
        assert_eq!(shard_of("anything", 0), 0);
        // FNV-1a 64 of "a" is the published 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    fn loads(owner: &[Option<usize>], m: usize) -> Vec<usize> {
        let mut l = vec![0; m];
        for o in owner.iter().flatten() {
            l[*o] += 1;
        }
        l
    }

    #[test]
    fn every_shard_has_one_owner_and_loads_differ_by_at_most_one() {
        for m in 1..=12 {
            let names: Vec<String> = (0..m).map(|i| format!("pod-{i}")).collect();
            let members = fresh(&names);
            for n in [1u32, 7, 32, 100, 256] {
                let owner = assign("g", n, &members);
                assert!(owner.iter().all(Option::is_some), "n={n} m={m}");
                let l = loads(&owner, m);
                let (min, max) = (l.iter().min().copied(), l.iter().max().copied());
                assert!(
                    max.zip(min).is_some_and(|(a, b)| a - b <= 1),
                    "n={n} m={m}: {l:?}"
                );
            }
        }
    }

    /// Members that hold nothing yet.
    fn fresh(names: &[String]) -> Vec<Seat<'_>> {
        names
            .iter()
            .map(|n| Seat {
                identity: n,
                holds: &[],
            })
            .collect()
    }

    /// What each member holds under `owner`.
    fn holdings(owner: &[Option<usize>], m: usize) -> Vec<Vec<u32>> {
        let mut h = vec![Vec::new(); m];
        for (s, o) in owner.iter().enumerate() {
            if let Some(i) = o {
                h[*i].push(s as u32);
            }
        }
        h
    }

    /// The assignment of `names` holding `holds`.
    fn settled(group: &str, n: u32, names: &[String], holds: &[Vec<u32>]) -> Vec<Option<usize>> {
        let seats: Vec<Seat<'_>> = names
            .iter()
            .zip(holds)
            .map(|(identity, h)| Seat { identity, holds: h })
            .collect();
        assign(group, n, &seats)
    }

    #[test]
    fn a_leave_moves_only_the_leavers_shards_and_a_join_only_the_newcomers() {
        for n in [7u32, 32, 256] {
            for m in 2..=12usize {
                let names: Vec<String> = (0..m).map(|i| format!("pod-{i:02}")).collect();
                let first = assign("g", n, &fresh(&names));
                let held = holdings(&first, m);
                assert_eq!(settled("g", n, &names, &held), first, "a fixed point");
                for leaver in 0..m {
                    let keep = |i: &usize| *i != leaver;
                    let rest: Vec<String> = (0..m).filter(keep).map(|i| names[i].clone()).collect();
                    let rest_held: Vec<Vec<u32>> =
                        (0..m).filter(keep).map(|i| held[i].clone()).collect();
                    let after = settled("g", n, &rest, &rest_held);
                    let moved = (0..n as usize)
                        .filter(|&s| first[s].map(|i| &names[i]) != after[s].map(|i| &rest[i]))
                        .count();
                    assert_eq!(
                        moved,
                        held[leaver].len(),
                        "n={n} m={m}: a leave moved {moved}"
                    );
                }
                let mut joined = names.clone();
                joined.push("pod-new".into());
                joined.sort();
                let joined_held: Vec<Vec<u32>> = joined
                    .iter()
                    .map(|j| {
                        names
                            .iter()
                            .position(|x| x == j)
                            .map(|i| held[i].clone())
                            .unwrap_or_default()
                    })
                    .collect();
                let after = settled("g", n, &joined, &joined_held);
                let newcomer = joined.iter().position(|j| j == "pod-new").unwrap_or(0);
                let moved = (0..n as usize)
                    .filter(|&s| first[s].map(|i| &names[i]) != after[s].map(|i| &joined[i]))
                    .count();
                let taken = after.iter().filter(|o| **o == Some(newcomer)).count();
                assert_eq!(
                    moved, taken,
                    "n={n} m={m}: a join moved more than the newcomer took"
                );
                assert!(
                    taken <= (n as usize).div_ceil(m + 1),
                    "n={n} m={m}: {taken}"
                );
                let settled_again = holdings(&after, m + 1);
                assert_eq!(
                    settled("g", n, &joined, &settled_again),
                    after,
                    "n={n} m={m}: stable"
                );
            }
        }
    }

    #[test]
    fn a_shard_claimed_twice_has_one_owner_and_the_group_name_seeds_the_rest() {
        let a = Seat {
            identity: "a",
            holds: &[0, 1],
        };
        let b = Seat {
            identity: "b",
            holds: &[1, 2],
        };
        let owner = assign("g", 4, &[a, b]);
        assert!(owner.iter().all(Option::is_some));
        assert_eq!(owner.iter().filter(|o| **o == Some(0)).count(), 2);
        let names: Vec<String> = (0..6).map(|i| format!("pod-{i}")).collect();
        assert_ne!(
            assign("g", 256, &fresh(&names)),
            assign("h", 256, &fresh(&names))
        );
    }

    /// Replicas of different tenure versions must compute the same assignment: these
    /// vectors pin the weights, the capacities and the order of the rules.
    #[test]
    fn the_assignment_is_pinned_across_versions() {
        let fresh3 = [
            Seat {
                identity: "pod-a",
                holds: &[],
            },
            Seat {
                identity: "pod-b",
                holds: &[],
            },
            Seat {
                identity: "pod-c",
                holds: &[],
            },
        ];
        let got: Vec<usize> = assign("workers", 8, &fresh3)
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(got, PINNED_FRESH.to_vec(), "fresh members");
        let holding = [
            Seat {
                identity: "pod-a",
                holds: &[0, 1, 2, 3, 4, 5],
            },
            Seat {
                identity: "pod-b",
                holds: &[6, 7],
            },
            Seat {
                identity: "pod-c",
                holds: &[],
            },
        ];
        let got: Vec<usize> = assign("workers", 8, &holding)
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(got, PINNED_HOLDING.to_vec(), "members holding shards");
    }

    /// The weights computed from the shard's prefix are the definition's, byte for byte.
    #[test]
    fn weights_are_the_hash_of_the_whole_key() {
        for (group, shard, member) in [
            ("workers", 0, "r0"),
            ("workers", 4095, "pod-7f9c-xyz"),
            ("", 1 << 31, ""),
            ("g\u{e9}", 77, "m\u{1f600}"),
        ] {
            let mut bytes = group.as_bytes().to_vec();
            bytes.push(0xff);
            bytes.extend_from_slice(&u32::to_be_bytes(shard));
            bytes.push(0xff);
            bytes.extend_from_slice(member.as_bytes());
            assert_eq!(
                ShardWeights::new(group_prefix(group), shard).of(member),
                mix(fnv1a64(&bytes)),
                "{group:?} {shard} {member:?}"
            );
        }
    }

    #[test]
    fn no_members_own_nothing() {
        assert_eq!(assign("g", 3, &[]), vec![None, None, None]);
        assert!(
            assign(
                "g",
                0,
                &[Seat {
                    identity: "a",
                    holds: &[7]
                }]
            )
            .is_empty()
        );
    }

    const PINNED_FRESH: [usize; 8] = [2, 0, 0, 1, 1, 1, 2, 2];
    const PINNED_HOLDING: [usize; 8] = [2, 1, 2, 0, 2, 0, 1, 1];
}
