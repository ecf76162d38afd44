//! Byte-based admission: every request reserves the memory its decode will
//! take, step by step, before taking it, from one budget derived from the
//! store's memory budget. A request that finds the budget spent is refused
//! as overload (429 / RESOURCE_EXHAUSTED) instead of being decoded, so many
//! large requests at once cannot add up to more than the store has,
//! whatever their count. The store's ingest path holds one gate; the query
//! API (kiln-store) holds another for query bodies.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::StorageError;

/// Reservations are counted in KiB so that one acquire (a `u32`) covers
/// any single request.
const UNIT_BYTES: u64 = 1024;

/// The shared budget.
#[derive(Debug)]
pub struct MemoryGate {
    semaphore: Arc<Semaphore>,
    budget_bytes: u64,
}

/// Memory one request holds; released on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.permit
            .as_ref()
            .map_or(0, |p| p.num_permits() as u64 * UNIT_BYTES)
    }
}

impl MemoryGate {
    /// A budget of `budget_bytes`.
    pub fn new(budget_bytes: u64) -> Self {
        let units = usize::try_from(budget_bytes.div_ceil(UNIT_BYTES))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            semaphore: Arc::new(Semaphore::new(units)),
            budget_bytes,
        }
    }

    /// Adds `bytes` to `reservation`, or refuses at once when the budget
    /// cannot hold them now (or ever).
    pub fn reserve(&self, reservation: &mut Reservation, bytes: usize) -> Result<(), StorageError> {
        if bytes == 0 {
            return Ok(());
        }
        let wanted = reservation.bytes().saturating_add(bytes as u64);
        if wanted > self.budget_bytes {
            return Err(StorageError::OverMemoryBudget {
                bytes: wanted,
                budget: self.budget_bytes,
            });
        }
        let units = u32::try_from((bytes as u64).div_ceil(UNIT_BYTES)).unwrap_or(u32::MAX);
        let permit = Arc::clone(&self.semaphore)
            .try_acquire_many_owned(units)
            .map_err(|_| StorageError::MemoryBusy {
                bytes: bytes as u64,
                budget: self.budget_bytes,
            })?;
        match &mut reservation.permit {
            Some(held) => held.merge(permit),
            None => reservation.permit = Some(permit),
        }
        Ok(())
    }

    /// Bytes reserved right now, for metrics.
    pub fn reserved_bytes(&self) -> u64 {
        let total = self.budget_bytes.div_ceil(UNIT_BYTES);
        total.saturating_sub(self.semaphore.available_permits() as u64) * UNIT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_to_the_budget_and_are_released_on_drop() {
        let gate = MemoryGate::new(10 << 20);
        let mut first = Reservation::default();
        gate.reserve(&mut first, 4 << 20).expect("fits");
        gate.reserve(&mut first, 2 << 20).expect("grows");
        let mut second = Reservation::default();
        let busy = gate.reserve(&mut second, 5 << 20).unwrap_err();
        assert!(matches!(busy, StorageError::MemoryBusy { .. }), "{busy}");
        assert_eq!(busy.class(), crate::ErrorClass::Overloaded);
        gate.reserve(&mut second, 4 << 20).expect("what is left");
        assert_eq!(gate.reserved_bytes(), 10 << 20);
        drop(first);
        assert_eq!(gate.reserved_bytes(), 4 << 20);
        let never = gate.reserve(&mut second, 7 << 20).unwrap_err();
        assert!(
            matches!(never, StorageError::OverMemoryBudget { .. }),
            "{never}"
        );
        assert!(never.is_client_error());
    }
}
