//! Java methods in CPU profiles: HotSpot JVMs started without flags.
//!
//! HotSpot exports tables describing its own structures for debuggers
//! ([`vmstructs`]). From them the agent finds the code cache and, for a pc
//! in it, the code blob that holds it; compiled methods keep no frame
//! pointer, so their callers are found from each blob's frame size, and
//! interpreted frames from the frame pointer and the method they hold.

pub mod vmstructs;

#[cfg(test)]
mod test_memory;
