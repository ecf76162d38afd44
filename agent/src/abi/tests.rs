use super::*;

#[test]
fn new_process_parses_native_endian_bytes_and_rejects_short_input() {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&42u32.to_ne_bytes());
    bytes[8..16].copy_from_slice(&7_000u64.to_ne_bytes());
    let event = NewProcess::from_bytes(&bytes).expect("16 bytes suffice");
    assert_eq!((event.pid, event.start_boottime_ns), (42, 7_000));
    assert_eq!(NewProcess::from_bytes(&bytes[..12]), None);
}

#[test]
fn stack_snapshot_parses_and_clamps_lengths() {
    let mut bytes = vec![0u8; STACK_SNAPSHOT_SIZE];
    bytes[0..4].copy_from_slice(&7u32.to_ne_bytes());
    bytes[24..32].copy_from_slice(&0x4000u64.to_ne_bytes());
    bytes[32..40].copy_from_slice(&0x7ff0u64.to_ne_bytes());
    bytes[48..52].copy_from_slice(&2u32.to_ne_bytes());
    bytes[52..56].copy_from_slice(&u32::MAX.to_ne_bytes());
    bytes[96..104].copy_from_slice(&0xffff_0001u64.to_ne_bytes());
    let snapshot = StackSnapshot::from_bytes(&bytes).expect("full record");
    assert_eq!((snapshot.kind, snapshot.off_cpu_ns), (SampleKind::Cpu, 0));
    assert_eq!(
        (snapshot.pid, snapshot.ip, snapshot.sp),
        (7, 0x4000, 0x7ff0)
    );
    assert_eq!(snapshot.kernel, vec![0xffff_0001, 0]);
    assert_eq!(snapshot.stack.len(), STACK_SNAPSHOT_BYTES, "clamped");
    assert_eq!(StackSnapshot::from_bytes(&bytes[..100]), None);
}

#[test]
fn comm_stops_at_the_first_nul() {
    let mut comm = [0u8; 16];
    comm[..4].copy_from_slice(b"busy");
    assert_eq!(comm_to_string(&comm), "busy");
    assert_eq!(comm_to_string(&[b'x'; 16]), "x".repeat(16));
}

#[test]
fn counter_indices_are_dense_and_ordered() {
    for (i, counter) in KernelCounter::ALL.iter().enumerate() {
        assert_eq!(counter.index() as usize, i);
    }
}

#[test]
fn off_cpu_snapshot_weighs_its_block_by_the_one_in_n_it_was_chosen_by() {
    let mut bytes = vec![0u8; STACK_SNAPSHOT_SIZE];
    bytes[72..76].copy_from_slice(&1u32.to_ne_bytes());
    bytes[76..80].copy_from_slice(&4u32.to_ne_bytes());
    bytes[80..88].copy_from_slice(&123u64.to_ne_bytes());
    bytes[88..96].copy_from_slice(&2_500_000u64.to_ne_bytes());
    let snapshot = StackSnapshot::from_bytes(&bytes).expect("full record");
    assert_eq!(
        (snapshot.kind, snapshot.off_cpu_ns),
        (SampleKind::OffCpu, 10_000_000)
    );
    // A capture always records its one-in-N; a zero is read as one.
    bytes[76..80].copy_from_slice(&0u32.to_ne_bytes());
    let snapshot = StackSnapshot::from_bytes(&bytes).expect("full record");
    assert_eq!(snapshot.off_cpu_ns, 2_500_000);
}
