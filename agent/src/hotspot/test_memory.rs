//! A process's memory made of regions, for tests.

use crate::python::memory::MemoryReadError;

use super::vmstructs::RemoteMemory;

/// Regions of bytes at addresses; anything else is unmapped.
#[derive(Debug, Default)]
pub struct FakeMemory {
    regions: Vec<(u64, Vec<u8>)>,
}

impl FakeMemory {
    /// Maps `bytes` at `address`.
    pub fn map(&mut self, address: u64, bytes: Vec<u8>) {
        self.regions.push((address, bytes));
    }

    /// Writes `bytes` at `address`, inside a mapped region.
    pub fn write(&mut self, address: u64, bytes: &[u8]) {
        let (base, region) = self
            .regions
            .iter_mut()
            .find(|(base, region)| {
                *base <= address && address + bytes.len() as u64 <= *base + region.len() as u64
            })
            .expect("write inside a mapped region");
        let start = (address - *base) as usize;
        region[start..start + bytes.len()].copy_from_slice(bytes);
    }

    /// Writes a u64.
    pub fn write_u64(&mut self, address: u64, value: u64) {
        self.write(address, &value.to_le_bytes());
    }
}

impl RemoteMemory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryReadError> {
        for (base, region) in &self.regions {
            let end = *base + region.len() as u64;
            if *base <= address && address.saturating_add(buffer.len() as u64) <= end {
                let start = (address - base) as usize;
                buffer.copy_from_slice(&region[start..start + buffer.len()]);
                return Ok(());
            }
        }
        Err(MemoryReadError {
            pid: 0,
            address,
            len: buffer.len(),
            errno: libc::EFAULT,
        })
    }
}
