//! The query memory budget: what the query API's requests hold of the
//! store's memory for their bodies and what is parsed from them, reserved
//! as the bytes arrive and given back when the request ends.
//!
//! Reads are open by default, so any pod that can reach the store can send
//! queries. Without a budget, the number of query slots times the largest
//! body (and what the body decodes to) could add up to more than the pod
//! has. A query that finds the budget in use is answered 429 at once
//! instead of waiting; one that could never fit is answered 413.

use kiln_storage::StorageError;
use kiln_storage::memory_gate::{MemoryGate, Reservation};

use crate::error::ApiError;

/// What one query holds of the budget; given back on drop.
pub type QueryReservation = Reservation;

/// The budget all queries in flight share: the same byte gate that ingest
/// reserves from, with the query API's own errors.
#[derive(Debug)]
pub struct QueryMemory {
    gate: MemoryGate,
}

impl QueryMemory {
    /// A budget of `budget_bytes`.
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            gate: MemoryGate::new(budget_bytes),
        }
    }

    /// Adds `bytes` to `reservation`, or refuses at once when the budget
    /// cannot hold them now (429) or ever (413).
    pub fn reserve(
        &self,
        reservation: &mut QueryReservation,
        bytes: usize,
    ) -> Result<(), ApiError> {
        self.gate
            .reserve(reservation, bytes)
            .map_err(|error| match error {
                StorageError::OverMemoryBudget { bytes, budget } => {
                    ApiError::QueryOverBudget { bytes, budget }
                }
                StorageError::MemoryBusy { bytes, budget } => {
                    ApiError::QueryMemoryBusy { bytes, budget }
                }
                other => ApiError::from(other),
            })
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
        drop(first);
        // What `first` held is free again: `second` can grow into it.
        memory.reserve(&mut second, 2 << 20).unwrap();
        assert_eq!(second.bytes(), 4 << 20);
        let never = memory.reserve(&mut second, 1).unwrap_err();
        assert_eq!(never.http_status(), 413, "{never}");
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
