//! The query memory budget: what the query API's requests hold of the
//! store's memory for their bodies and what is parsed from them, reserved
//! as the bytes arrive and given back when the request ends.
//!
//! Reads are open by default, so any pod that can reach the store can send
//! queries. Without a budget, the number of query slots times the largest
//! body (and what the body decodes to) could add up to more than the pod
//! has. A query that finds the budget in use is answered 429 at once
//! instead of waiting; one that could never fit is answered 413.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Reservations are counted in KiB so that one acquire (a `u32`) covers
/// any single request.
const UNIT_BYTES: u64 = 1024;

/// The budget all queries in flight share.
#[derive(Debug)]
pub struct QueryMemory {
    semaphore: Arc<Semaphore>,
    budget_bytes: u64,
}

/// What one query holds of the budget; given back on drop.
#[derive(Debug, Default)]
pub struct QueryReservation {
    permit: Option<OwnedSemaphorePermit>,
}

impl QueryReservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.permit
            .as_ref()
            .map_or(0, |p| p.num_permits() as u64 * UNIT_BYTES)
    }
}

impl QueryMemory {
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
    /// cannot hold them now (429) or ever (413).
    pub fn reserve(
        &self,
        reservation: &mut QueryReservation,
        bytes: usize,
    ) -> Result<(), ApiError> {
        if bytes == 0 {
            return Ok(());
        }
        let wanted = reservation.bytes().saturating_add(bytes as u64);
        if wanted > self.budget_bytes {
            return Err(ApiError::QueryOverBudget {
                bytes: wanted,
                budget: self.budget_bytes,
            });
        }
        let units = u32::try_from((bytes as u64).div_ceil(UNIT_BYTES)).unwrap_or(u32::MAX);
        let permit = Arc::clone(&self.semaphore)
            .try_acquire_many_owned(units)
            .map_err(|_| ApiError::QueryMemoryBusy {
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
    fn reservations_add_up_to_the_budget_and_are_given_back_on_drop() {
        let memory = QueryMemory::new(4 << 20);
        let mut first = QueryReservation::default();
        memory.reserve(&mut first, 1 << 20).unwrap();
        memory.reserve(&mut first, 1 << 20).unwrap();
        assert_eq!(first.bytes(), 2 << 20);
        let mut second = QueryReservation::default();
        let busy = memory.reserve(&mut second, 3 << 20).unwrap_err();
        assert_eq!(busy.http_status(), 429, "{busy}");
        memory.reserve(&mut second, 2 << 20).unwrap();
        assert_eq!(memory.reserved_bytes(), 4 << 20);
        drop(first);
        assert_eq!(memory.reserved_bytes(), 2 << 20);
        let never = memory.reserve(&mut second, 3 << 20).unwrap_err();
        assert_eq!(never.http_status(), 413, "{never}");
        drop(second);
        assert_eq!(memory.reserved_bytes(), 0);
    }

    #[test]
    fn small_reservations_take_whole_units() {
        let memory = QueryMemory::new(2048);
        let mut one = QueryReservation::default();
        memory.reserve(&mut one, 1).unwrap();
        memory.reserve(&mut one, 0).unwrap();
        assert_eq!(one.bytes(), 1024);
        let mut other = QueryReservation::default();
        memory.reserve(&mut other, 1024).unwrap();
        assert!(memory.reserve(&mut other, 1).is_err());
    }
}
