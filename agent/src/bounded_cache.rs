//! A size-bounded map with approximate least-recently-used eviction (pure).
//!
//! Two generations: lookups hit the young one or promote from the old one;
//! when the young one fills up, the old one is dropped and the young one
//! ages. Memory stays below `2 * half_capacity` entries, and everything used
//! within the last half-capacity insertions survives.

use std::collections::HashMap;
use std::hash::Hash;

/// A bounded cache; see the module docs.
#[derive(Debug)]
pub struct BoundedCache<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    half_capacity: usize,
    evictions: u64,
}

impl<K: Hash + Eq, V> BoundedCache<K, V> {
    /// A cache holding at most `capacity` entries (at least 2).
    pub fn new(capacity: usize) -> Self {
        BoundedCache {
            young: HashMap::new(),
            old: HashMap::new(),
            half_capacity: (capacity / 2).max(1),
            evictions: 0,
        }
    }

    /// The value for `key`, refreshing it.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        if !self.young.contains_key(key) {
            let (key, value) = self.old.remove_entry(key)?;
            self.insert(key, value);
        }
        self.young.get(key)
    }

    /// Whether `key` is present (without refreshing it).
    pub fn contains(&self, key: &K) -> bool {
        self.young.contains_key(key) || self.old.contains_key(key)
    }

    /// Inserts or replaces the value for `key`.
    pub fn insert(&mut self, key: K, value: V) {
        if self.young.len() >= self.half_capacity && !self.young.contains_key(&key) {
            self.evictions += self.old.len() as u64;
            self.old = std::mem::take(&mut self.young);
        }
        self.old.remove(&key);
        self.young.insert(key, value);
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries dropped to stay within the bound, since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_never_exceeds_its_capacity() {
        let mut cache = BoundedCache::new(10);
        for i in 0..1000 {
            cache.insert(i, i);
            assert!(cache.len() <= 10);
        }
        assert!(cache.evictions() >= 990);
    }

    #[test]
    fn recently_used_entries_survive_eviction() {
        let mut cache = BoundedCache::new(4);
        cache.insert("keep", 1);
        for i in 0..20 {
            assert_eq!(cache.get(&"keep"), Some(&1));
            cache.insert(if i % 2 == 0 { "a" } else { "b" }, i);
        }
        assert!(cache.contains(&"keep"));
    }
}
