//! Java frames in unwound stacks (pure): like Python's frames
//! (`python::frames`), a Java frame goes into the stack as a tagged id
//! naming an entry of the window's [`JavaFrameTable`]. The tag has the
//! Python tag's bit (so the symbolizer leaves it alone) and its own.

use crate::frame_table::{FrameName, FrameTable, FrameTag};
use crate::python::frames::PYTHON_FRAME_TAG;

/// This runtime's own bit; Ruby's is 1 << 62.
const JAVA_BIT: u64 = 1 << 60;
/// Marks a stack entry as a Java frame id.
pub const JAVA_FRAME_TAG: u64 = PYTHON_FRAME_TAG | JAVA_BIT;

/// Whether a stack entry is a Java frame.
pub fn is_java_frame(entry: u64) -> bool {
    entry & JAVA_FRAME_TAG == JAVA_FRAME_TAG
}

/// What a Java frame shows in a profile: `Class.method(signature)` or a
/// stub's name, source file name (empty when unknown), line (0: unknown).
pub type JavaFrameName = FrameName;

/// The name given to frames past a window's capacity.
pub const OVER_CAPACITY: &str = "[java frames over the window's limit]";

/// Java's ids: the Python bit and Java's own.
#[derive(Debug)]
pub struct JavaTag;

impl FrameTag for JavaTag {
    const TAG: u64 = JAVA_FRAME_TAG;
    const MASK: u64 = JAVA_FRAME_TAG;
    const OVER_CAPACITY: &'static str = OVER_CAPACITY;
}

/// The Java frames of one window, by id, bounded.
pub type JavaFrameTable = FrameTable<JavaTag>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
