use super::*;
use crate::process_info::{ProcessTable, boottime_ns_to_ticks, parse_stat_start_ticks};

#[inline(never)]
fn kiln_symbolization_marker() -> u64 {
    std::hint::black_box(42)
}

fn own_snapshot(table: &mut ProcessTable) -> Arc<ProcessSnapshot> {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    let ticks = parse_stat_start_ticks(&stat).expect("start time");
    // SAFETY: sysconf only reads a configuration value.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("positive");
    let ns = ticks * (1_000_000_000 / hz);
    assert_eq!(boottime_ns_to_ticks(ns, hz), ticks);
    table
        .refresh(std::process::id(), ns)
        .expect("own process readable")
}

#[test]
fn an_object_with_symbol_tables_over_the_cap_is_not_parsed() {
    assert_eq!(kiln_symbolization_marker(), 42);
    let mut table = ProcessTable::new(8, 8);
    let snapshot = own_snapshot(&mut table);
    let mut symbolizer = StackSymbolizer::new(KernelSymbols::default(), 1000);
    symbolizer.set_max_symbol_table_bytes(1);
    let address = kiln_symbolization_marker as *const () as u64;
    let mut stats = SymbolizationStats::default();
    let stacks: [&[u64]; 1] = [&[address]];
    let frames = symbolizer.user_frames(Some(&snapshot), &stacks, &mut stats);
    let frame = &frames[0][0];
    assert_eq!(frame.function, None, "left for the store to symbolize");
    assert!(
        frame
            .mapping
            .as_ref()
            .is_some_and(|m| !m.build_id.is_empty())
    );
    assert_eq!(symbolizer.take_refused_objects(), 1);
    assert_eq!(symbolizer.take_refused_objects(), 0);
}

#[test]
fn own_function_is_named_with_its_mapping_and_build_id() {
    assert_eq!(kiln_symbolization_marker(), 42);
    let mut table = ProcessTable::new(8, 8);
    let snapshot = own_snapshot(&mut table);
    let mut symbolizer = StackSymbolizer::new(KernelSymbols::default(), 1000);
    let address = kiln_symbolization_marker as *const () as u64;
    let mut stats = SymbolizationStats::default();
    let stacks: [&[u64]; 1] = [&[address]];
    symbolizer.queue_user_lookups(&snapshot, &stacks);
    symbolizer.run_queued_lookups();
    let frames = symbolizer.user_frames(Some(&snapshot), &stacks, &mut stats);
    let frame = &frames[0][0];
    let name = frame.function.as_deref().expect("symbolized");
    assert!(name.contains("kiln_symbolization_marker"), "got {name}");
    let mapping = frame.mapping.as_ref().expect("mapped");
    let exe = std::fs::read_link("/proc/self/exe").expect("exe link");
    assert_eq!(mapping.name, exe.to_string_lossy());
    assert_eq!(
        stats,
        SymbolizationStats {
            symbolized: 1,
            unsymbolized: 0
        }
    );
}

#[test]
fn unknown_processes_keep_addresses_and_callers_point_into_the_call() {
    let mut symbolizer = StackSymbolizer::new(KernelSymbols::default(), 10);
    let mut stats = SymbolizationStats::default();
    let stacks: [&[u64]; 1] = [&[0x1000, 0x2000]];
    let frames = symbolizer.user_frames(None, &stacks, &mut stats);
    let addresses: Vec<u64> = frames[0].iter().map(|f| f.address).collect();
    assert_eq!(addresses, vec![0x1000, 0x1fff]);
    assert!(
        frames[0]
            .iter()
            .all(|f| f.mapping.is_none() && f.function.is_none())
    );
    assert_eq!(stats.unsymbolized, 2);
}

#[test]
fn kernel_frames_are_named_from_kallsyms_under_the_kernel_mapping() {
    let kernel = KernelSymbols::parse("ffffffff81000000 T do_syscall_64\n");
    let mut symbolizer = StackSymbolizer::new(kernel, 10);
    let mut stats = SymbolizationStats::default();
    let frames = symbolizer.kernel_frames(&[0xffffffff81000010, 0x10], &mut stats);
    assert_eq!(frames[0].function.as_deref(), Some("do_syscall_64"));
    assert_eq!(frames[1].function, None);
    let mapping = frames[0].mapping.as_ref().expect("kernel mapping");
    assert_eq!(mapping.name, KERNEL_MAPPING_NAME);
    assert_eq!(
        stats,
        SymbolizationStats {
            symbolized: 1,
            unsymbolized: 1
        }
    );
}
