//! Java frames in unwound stacks (pure): like Python's frames
//! (`python::frames`), a Java frame goes into the stack as a tagged id
//! naming an entry of the window's [`JavaFrameTable`]. The tag has the
//! Python tag's bit (so the symbolizer leaves it alone) and its own.

use std::collections::HashMap;
use std::sync::Arc;

use crate::python::frames::PYTHON_FRAME_TAG;

/// This runtime's own bit; Ruby's is 1 << 62.
const JAVA_BIT: u64 = 1 << 60;
/// Marks a stack entry as a Java frame id.
pub const JAVA_FRAME_TAG: u64 = PYTHON_FRAME_TAG | JAVA_BIT;

/// Whether a stack entry is a Java frame.
pub fn is_java_frame(entry: u64) -> bool {
    entry & JAVA_FRAME_TAG == JAVA_FRAME_TAG
}

/// What a Java frame shows in a profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JavaFrameName {
    /// `Class.method(signature)`, or a stub's name.
    pub function: Arc<str>,
    /// Source file name, empty when unknown.
    pub file: Arc<str>,
    /// Line (0: unknown).
    pub line: u32,
}

/// The name given to frames past a window's capacity.
pub const OVER_CAPACITY: &str = "[java frames over the window's limit]";

/// The Java frames of one window, by id; bounded like Python's.
#[derive(Debug)]
pub struct JavaFrameTable {
    names: Vec<JavaFrameName>,
    ids: HashMap<JavaFrameName, u64>,
    capacity: usize,
}

impl JavaFrameTable {
    /// A table of at most `capacity` distinct frames per window.
    pub fn new(capacity: usize) -> JavaFrameTable {
        JavaFrameTable {
            names: Vec::new(),
            ids: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The tagged stack entry for `name`.
    pub fn intern(&mut self, name: JavaFrameName) -> u64 {
        if let Some(&id) = self.ids.get(&name) {
            return id | JAVA_FRAME_TAG;
        }
        let name = if self.names.len() + 1 >= self.capacity {
            JavaFrameName {
                function: Arc::from(OVER_CAPACITY),
                file: Arc::from(""),
                line: 0,
            }
        } else {
            name
        };
        if let Some(&id) = self.ids.get(&name) {
            return id | JAVA_FRAME_TAG;
        }
        let id = self.names.len() as u64;
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id | JAVA_FRAME_TAG
    }

    /// The frame a tagged entry names.
    pub fn get(&self, entry: u64) -> Option<&JavaFrameName> {
        if !is_java_frame(entry) {
            return None;
        }
        self.names
            .get(usize::try_from(entry & !JAVA_FRAME_TAG).ok()?)
    }

    /// Forgets every frame (at the end of a window).
    pub fn clear(&mut self) {
        self.names.clear();
        self.ids.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::frames::{PythonFrameName, PythonFrameTable, is_python_frame};

    fn name(function: &str) -> JavaFrameName {
        JavaFrameName {
            function: Arc::from(function),
            file: Arc::from("Main.java"),
            line: 0,
        }
    }

    #[test]
    fn java_ids_are_kept_from_native_symbolization_and_apart_from_python_ids() {
        let mut table = JavaFrameTable::new(3);
        let hot = table.intern(name("Main.hot(I)J"));
        assert!(is_java_frame(hot) && is_python_frame(hot));
        assert_eq!(table.intern(name("Main.hot(I)J")), hot);
        assert_eq!(table.get(hot).map(|n| &*n.function), Some("Main.hot(I)J"));
        let mut python = PythonFrameTable::new(3);
        let py = python.intern(PythonFrameName {
            function: Arc::from("f"),
            file: Arc::from("f.py"),
            line: 1,
        });
        assert_eq!(table.get(py), None, "a Python id is not a Java frame");
        assert_eq!(python.get(hot), None, "a Java id is not a Python frame");
        table.intern(name("Main.caller(I)J"));
        let over = table.intern(name("Main.main([Ljava/lang/String;)V"));
        assert_eq!(table.get(over).map(|n| &*n.function), Some(OVER_CAPACITY));
        table.clear();
        assert_eq!(table.get(hot), None);
    }
}
