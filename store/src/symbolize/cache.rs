//! What the symbolizer knows: resolved addresses by (build id, file
//! offset), within a byte budget (oldest out first), and build ids found
//! nowhere, each with when to look again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kiln_debuginfo::BuildId;
use kiln_debuginfo::cache_file::{CacheContents, MissingBuildId, ResolvedAddress};
use kiln_engine::SymbolizedFrame;

/// Most build ids remembered as missing: each costs a few dozen bytes,
/// and a flood of made-up ids must not grow the cache without bound.
const MAX_MISSING: usize = 100_000;

type Key = (BuildId, u64);

/// The cache; see the module docs.
#[derive(Debug)]
pub struct SymbolCache {
    /// By build id, then file offset, so a query looks an address up by
    /// the build id text it holds, without building a key.
    resolved: HashMap<BuildId, HashMap<u64, Arc<[SymbolizedFrame]>>>,
    order: VecDeque<Key>,
    bytes: usize,
    budget: usize,
    missing: HashMap<BuildId, i64>,
    /// Changed since it was last written out.
    pub dirty: bool,
}

/// A debug file's frames as queries take them. The two types live in crates
/// that do not know each other (the engine stays free of ELF parsing), so
/// the conversion lives here, where both meet.
pub fn symbolized(frames: Vec<kiln_debuginfo::Frame>) -> Arc<[SymbolizedFrame]> {
    frames
        .into_iter()
        .map(|f| SymbolizedFrame {
            function: f.function,
            file: f.file,
            line: f.line,
        })
        .collect()
}

fn entry_bytes(key: &Key, frames: &[SymbolizedFrame]) -> usize {
    96 + key.0.as_str().len()
        + frames
            .iter()
            .map(|f| 64 + f.function.len() + f.file.len())
            .sum::<usize>()
}

impl SymbolCache {
    /// An empty cache of `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            resolved: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
            missing: HashMap::new(),
            dirty: false,
        }
    }

    /// The frames of an address, if it was resolved (empty: the debug file
    /// does not know it).
    pub fn get(&self, build_id: &str, file_offset: u64) -> Option<Arc<[SymbolizedFrame]>> {
        self.resolved.get(build_id)?.get(&file_offset).cloned()
    }

    /// Whether `build_id` was looked for and not found, and its retry time
    /// has not come.
    pub fn is_missing(&self, build_id: &BuildId, now_ms: i64) -> bool {
        self.missing.get(build_id).is_some_and(|&at| now_ms < at)
    }

    /// Keeps an address's frames, dropping the oldest entries past the budget.
    pub fn insert(&mut self, build_id: BuildId, file_offset: u64, frames: Arc<[SymbolizedFrame]>) {
        let key = (build_id, file_offset);
        let bytes = entry_bytes(&key, &frames);
        if bytes > self.budget {
            return;
        }
        self.missing.remove(&key.0);
        let by_offset = self.resolved.entry(key.0.clone()).or_default();
        if let Some(old) = by_offset.insert(key.1, frames) {
            self.bytes -= entry_bytes(&key, &old);
        } else {
            self.order.push_back(key);
        }
        self.bytes += bytes;
        self.dirty = true;
        while self.bytes > self.budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            let Some(by_offset) = self.resolved.get_mut(&oldest.0) else {
                continue;
            };
            if let Some(frames) = by_offset.remove(&oldest.1) {
                self.bytes -= entry_bytes(&oldest, &frames);
            }
            if by_offset.is_empty() {
                self.resolved.remove(&oldest.0);
            }
        }
    }

    /// Remembers that `build_id` was found nowhere, until `retry_at_ms`.
    pub fn insert_missing(&mut self, build_id: BuildId, retry_at_ms: i64) {
        if self.missing.len() >= MAX_MISSING {
            let now_expired: Vec<BuildId> = self
                .missing
                .iter()
                .filter(|&(_, &at)| at <= retry_at_ms.saturating_sub(1))
                .map(|(id, _)| id.clone())
                .take(MAX_MISSING / 10)
                .collect();
            for id in now_expired {
                self.missing.remove(&id);
            }
            if self.missing.len() >= MAX_MISSING {
                return;
            }
        }
        self.missing.insert(build_id, retry_at_ms);
        self.dirty = true;
    }

    /// Forgets everything about `build_id` (its debug info was just
    /// uploaded): its next query looks it up again.
    pub fn forget(&mut self, build_id: &BuildId) {
        self.missing.remove(build_id);
        if let Some(by_offset) = self.resolved.remove(build_id) {
            for (offset, frames) in by_offset {
                self.bytes -= entry_bytes(&(build_id.clone(), offset), &frames);
            }
            self.order.retain(|key| &key.0 != build_id);
        }
        self.dirty = true;
    }

    /// Bytes held by resolved addresses.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Everything, oldest first, for the cache file.
    pub fn contents(&self) -> CacheContents {
        let resolved = self
            .order
            .iter()
            .filter_map(|key| {
                let frames = self.resolved.get(&key.0)?.get(&key.1)?;
                Some(ResolvedAddress {
                    build_id: key.0.clone(),
                    file_offset: key.1,
                    frames: frames
                        .iter()
                        .map(|f| kiln_debuginfo::Frame {
                            function: f.function.clone(),
                            file: f.file.clone(),
                            line: f.line,
                        })
                        .collect(),
                })
            })
            .collect();
        let missing = self
            .missing
            .iter()
            .map(|(id, &at)| MissingBuildId {
                build_id: id.clone(),
                retry_at_ms: at,
            })
            .collect();
        CacheContents { resolved, missing }
    }

    /// Takes in what a cache file held (oldest first), within the budget.
    pub fn load(&mut self, contents: CacheContents) {
        for entry in contents.resolved {
            self.insert(entry.build_id, entry.file_offset, symbolized(entry.frames));
        }
        for missing in contents.missing {
            self.insert_missing(missing.build_id, missing.retry_at_ms);
        }
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(name: &str) -> Arc<[SymbolizedFrame]> {
        Arc::from(vec![SymbolizedFrame {
            function: name.to_owned(),
            file: "a.c".to_owned(),
            line: 1,
        }])
    }

    #[test]
    fn the_cache_keeps_its_budget_by_dropping_the_oldest() {
        let id = BuildId::parse("abcd").unwrap();
        let one = entry_bytes(&(id.clone(), 0), &frames("f"));
        let mut cache = SymbolCache::new(one * 2);
        for offset in 0..3 {
            cache.insert(id.clone(), offset, frames("f"));
        }
        assert!(cache.bytes() <= one * 2);
        assert!(cache.get(id.as_str(), 0).is_none());
        assert!(cache.get(id.as_str(), 2).is_some());
    }

    #[test]
    fn a_missing_build_id_waits_for_its_retry_time_and_an_upload_forgets_it() {
        let id = BuildId::parse("abcd").unwrap();
        let mut cache = SymbolCache::new(1 << 20);
        cache.insert_missing(id.clone(), 1_000);
        assert!(cache.is_missing(&id, 999));
        assert!(!cache.is_missing(&id, 1_000));
        cache.insert(id.clone(), 5, Arc::from(Vec::new()));
        cache.insert_missing(id.clone(), 1_000);
        cache.forget(&id);
        assert!(!cache.is_missing(&id, 0));
        assert!(cache.get(id.as_str(), 5).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn contents_load_back_into_an_equal_cache() {
        let id = BuildId::parse("abcd").unwrap();
        let mut cache = SymbolCache::new(1 << 20);
        cache.insert(id.clone(), 7, frames("hot"));
        cache.insert_missing(BuildId::parse("ffff").unwrap(), 42);
        let mut loaded = SymbolCache::new(1 << 20);
        loaded.load(cache.contents());
        assert_eq!(loaded.get(id.as_str(), 7), cache.get(id.as_str(), 7));
        assert!(loaded.is_missing(&BuildId::parse("ffff").unwrap(), 41));
        assert!(!loaded.dirty);
    }
}
