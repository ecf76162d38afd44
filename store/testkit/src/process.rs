//! Guards for the processes a test starts, so that a failing assertion
//! never leaves a store, an agent or a workload running behind it.

use std::process::Child;

/// A child process that is killed and reaped when the guard drops.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
