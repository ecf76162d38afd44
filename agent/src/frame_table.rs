//! Runtime frames among native ones (pure): one table per runtime and window.
//!
//! Unwound user stacks are `Vec<u64>` of instruction pointers, counted as
//! keys per window. A frame that a runtime names (Python, Ruby, Java,
//! JavaScript) goes into the same vector as an id under its runtime's tag
//! bits, naming an entry of the window's [`FrameTable`]: (function, file,
//! line). User addresses never have the top bits set, so an id is never
//! taken for an address, and identical frames count as one key, like
//! identical pcs.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a runtime's frame shows in a profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameName {
    /// Function or method name, as the runtime qualifies it.
    pub function: Arc<str>,
    /// Source file, empty when unknown.
    pub file: Arc<str>,
    /// Line (0: unknown).
    pub line: u32,
}

/// How one runtime's ids are told apart: `entry & MASK == TAG`.
pub trait FrameTag {
    /// Set in every id of this runtime.
    const TAG: u64;
    /// The bits looked at to tell this runtime's ids; an id's index is the
    /// entry without them.
    const MASK: u64;
    /// The one name that frames past a window's capacity share.
    const OVER_CAPACITY: &'static str;

    /// Whether a stack entry is an id of this runtime.
    fn is_tagged(entry: u64) -> bool {
        entry & Self::MASK == Self::TAG
    }
}

/// The frames of one runtime in one window, by id. Bounded: past
/// `capacity` distinct frames, further ones share one
/// [`FrameTag::OVER_CAPACITY`] entry, so a process with endless distinct
/// frames costs a fixed amount of memory per window.
pub struct FrameTable<T> {
    names: Vec<FrameName>,
    ids: HashMap<FrameName, u64>,
    capacity: usize,
    tag: PhantomData<T>,
}

impl<T> fmt::Debug for FrameTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameTable")
            .field("frames", &self.names.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<T: FrameTag> FrameTable<T> {
    /// A table of at most `capacity` distinct frames per window.
    pub fn new(capacity: usize) -> FrameTable<T> {
        FrameTable {
            names: Vec::new(),
            ids: HashMap::new(),
            capacity: capacity.max(1),
            tag: PhantomData,
        }
    }

    /// The tagged stack entry for `name`.
    pub fn intern(&mut self, name: FrameName) -> u64 {
        if let Some(&id) = self.ids.get(&name) {
            return id | T::TAG;
        }
        let name = if self.names.len() + 1 >= self.capacity {
            FrameName {
                function: Arc::from(T::OVER_CAPACITY),
                file: Arc::from(""),
                line: 0,
            }
        } else {
            name
        };
        if let Some(&id) = self.ids.get(&name) {
            return id | T::TAG;
        }
        let id = self.names.len() as u64;
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id | T::TAG
    }

    /// The frame a tagged entry names.
    pub fn get(&self, entry: u64) -> Option<&FrameName> {
        if !T::is_tagged(entry) {
            return None;
        }
        self.names.get(usize::try_from(entry & !T::MASK).ok()?)
    }

    /// Forgets every frame (at the end of a window, once profiles are built).
    pub fn clear(&mut self) {
        self.names.clear();
        self.ids.clear();
    }

    /// Distinct frames held.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table holds no frame.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Low;
    impl FrameTag for Low {
        const TAG: u64 = 1 << 63;
        const MASK: u64 = 1 << 63;
        const OVER_CAPACITY: &'static str = "[low over]";
    }
    #[derive(Debug)]
    struct High;
    impl FrameTag for High {
        const TAG: u64 = 1 << 62;
        const MASK: u64 = 3 << 62;
        const OVER_CAPACITY: &'static str = "[high over]";
    }

    fn name(function: &str) -> FrameName {
        FrameName {
            function: Arc::from(function),
            file: Arc::from("f"),
            line: 1,
        }
    }

    #[test]
    fn ids_are_interned_tagged_and_told_apart() {
        let mut low = FrameTable::<Low>::new(8);
        let mut high = FrameTable::<High>::new(8);
        let a = low.intern(name("a"));
        assert_eq!(low.intern(name("a")), a, "the same frame is one id");
        let b = high.intern(name("a"));
        assert!(Low::is_tagged(a) && !High::is_tagged(a));
        assert!(High::is_tagged(b) && !Low::is_tagged(b));
        assert_eq!(low.get(a).map(|n| &*n.function), Some("a"));
        assert_eq!(low.get(b), None, "another runtime's id");
        assert_eq!(high.get(a), None, "another runtime's id");
        assert_eq!(low.get(0x40_1000), None, "an address");
        low.clear();
        assert_eq!(low.get(a), None);
        assert!(low.is_empty());
    }

    #[test]
    fn frames_past_capacity_share_one_entry() {
        let mut table = FrameTable::<Low>::new(3);
        table.intern(name("a"));
        table.intern(name("b"));
        let c = table.intern(name("c"));
        let d = table.intern(name("d"));
        assert_eq!(c, d);
        assert_eq!(table.get(d).map(|n| &*n.function), Some("[low over]"));
        assert_eq!(table.len(), 3);
    }
}
