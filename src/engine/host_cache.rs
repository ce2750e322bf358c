//! llama-server's prompt cache (`--cache-ram`): slots' tokens and cells kept in host
//! memory, so that a conversation whose slot went to other requests comes back without
//! its prompt being processed again. Host-only bookkeeping over [`Snapshot`]s; the
//! service decides when to save and restore (see `service/worker/slots.rs`).

use super::Snapshot;

/// Snapshots in host memory, the least recently used dropped beyond a byte limit.
#[derive(Debug, Default)]
pub struct HostCache {
    /// Most bytes of state held; `None`: no limit.
    limit: Option<usize>,
    entries: Vec<Entry>,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    snap: Snapshot,
    used: u64,
}

/// How many tokens `a` and `b` share at their start.
pub(super) fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl HostCache {
    pub fn new(limit: Option<usize>) -> Self {
        HostCache {
            limit,
            ..Default::default()
        }
    }

    /// Whether an entry already holds `tokens` (the same tokens, or more after them).
    pub fn covers(&self, tokens: &[u32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.snap.tokens.starts_with(tokens))
    }

    /// Keeps `snap`, dropping the entries it covers (whose tokens it starts with) and
    /// then the least recently used until the rest fits the limit. False, and nothing
    /// kept, when an entry already covers it or it alone exceeds the limit.
    pub fn insert(&mut self, snap: Snapshot) -> bool {
        if self.covers(&snap.tokens) || self.limit.is_some_and(|l| snap.state.len() > l) {
            return false;
        }
        self.entries
            .retain(|e| !snap.tokens.starts_with(&e.snap.tokens));
        self.clock += 1;
        self.entries.push(Entry {
            snap,
            used: self.clock,
        });
        if let Some(limit) = self.limit {
            while self.bytes() > limit {
                let oldest = (0..self.entries.len())
                    .min_by_key(|&i| self.entries[i].used)
                    .expect("over the limit with no entries");
                self.entries.remove(oldest);
            }
        }
        true
    }

    /// The entry sharing the longest prefix with `prompt`, if it shares more than
    /// `than` tokens: the entry and how many tokens it shares. The entry counts as used.
    pub fn best(&mut self, prompt: &[u32], than: usize) -> Option<(&Snapshot, usize)> {
        let (i, n) = (self.entries.iter().enumerate())
            .map(|(i, e)| (i, shared_prefix(&e.snap.tokens, prompt)))
            .max_by_key(|&(i, n)| (n, self.entries[i].used))?;
        if n <= than {
            return None;
        }
        self.clock += 1;
        self.entries[i].used = self.clock;
        Some((&self.entries[i].snap, n))
    }

    /// Bytes of state held.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.snap.state.len()).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(tokens: &[u32], bytes: usize) -> Snapshot {
        Snapshot {
            tokens: tokens.to_vec(),
            state: vec![0; bytes],
        }
    }

    #[test]
    fn longer_prompts_replace_their_prefixes_and_the_best_prefix_wins() {
        let mut c = HostCache::new(None);
        assert!(c.insert(snap(&[1, 2, 3], 10)));
        // Covered by what is held: nothing to add.
        assert!(!c.insert(snap(&[1, 2], 10)));
        assert!(c.insert(snap(&[1, 2, 3, 4], 10)));
        assert_eq!(c.len(), 1, "[1, 2, 3] is a prefix of [1, 2, 3, 4]");
        assert!(c.insert(snap(&[1, 9], 10)));
        assert_eq!(c.len(), 2);
        let (s, n) = c.best(&[1, 2, 3, 7], 0).unwrap();
        assert_eq!((s.tokens.as_slice(), n), (&[1, 2, 3, 4][..], 3));
        assert_eq!(c.best(&[1, 9, 9], 0).unwrap().1, 2);
        // No entry shares more than the slot already holds.
        assert!(c.best(&[1, 2, 3, 7], 3).is_none());
        assert!(c.best(&[5], 0).is_none());
    }

    #[test]
    fn the_least_recently_used_go_first_beyond_the_limit() {
        let mut c = HostCache::new(Some(25));
        assert!(c.insert(snap(&[1], 10)));
        assert!(c.insert(snap(&[2], 10)));
        // [1] is used, so [2] is the oldest when [3] arrives.
        assert!(c.best(&[1], 0).is_some());
        assert!(c.insert(snap(&[3], 10)));
        assert_eq!(c.len(), 2);
        assert!(c.covers(&[1]) && c.covers(&[3]) && !c.covers(&[2]));
        assert!(c.bytes() <= 25);
        // Larger than the whole cache: refused, and nothing dropped for it.
        assert!(!c.insert(snap(&[4], 26)));
        assert_eq!(c.len(), 2);
    }
}
