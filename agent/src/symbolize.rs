//! Symbolization on the node: kernel frames from kallsyms, user frames
//! normalized per mapping to (build id, file offset) and named from each
//! object's ELF symbols (`symbol_objects`), with perf maps for JIT code and
//! blazesym for the vDSO. Frames that cannot be
//! named keep their mapping, address and build id for the store.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use blazesym::symbolize::source::{self as blaze_source, Source};
use blazesym::symbolize::{self as blaze, Input};

use crate::bounded_cache::BoundedCache;
use crate::elf_symbols::ElfSymbolsError;
use crate::kallsyms::KernelSymbols;
use crate::perf_map::{PerfMap, PerfMapLimits, PerfMapRead, PerfMapVersion, read_process_perf_map};
use crate::proc_maps::{self, MappingKind};
use crate::process_info::{FileIdentity, MappedFile, ProcessSnapshot};
use crate::symbol_objects::SymbolObjects;

/// A mapping as it goes into pprof.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameMapping {
    /// Start of the mapped range.
    pub start: u64,
    /// End of the mapped range (exclusive).
    pub end: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// File path or special name.
    pub name: String,
    /// Build id (hex), empty when unknown.
    pub build_id: String,
}

/// The name of the kernel pseudo-mapping.
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// One resolved stack frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Instruction address (for callers: inside the call instruction).
    pub address: u64,
    /// The mapping the address lies in, when known.
    pub mapping: Option<Arc<FrameMapping>>,
    /// Function name, when symbolized.
    pub function: Option<Arc<str>>,
    /// Source file, when known (Python frames).
    pub file: Option<Arc<str>>,
    /// Source line, 0 when unknown.
    pub line: u32,
}

/// Counts of frames by outcome, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolizationStats {
    /// Frames given a function name.
    pub symbolized: u64,
    /// Frames left as mapping + address.
    pub unsymbolized: u64,
}

/// Caller frames hold return addresses, which point past the call; one byte
/// back lands inside the call instruction, in the right function and line.
pub fn call_site_addresses(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter()
        .enumerate()
        .map(|(depth, &ip)| if depth == 0 { ip } else { ip.saturating_sub(1) })
}

/// Symbolizes stacks. Not `Send` (blazesym's symbolizer is not), so it
/// lives on the collector thread.
#[derive(Debug)]
pub struct StackSymbolizer {
    blaze: blaze::Symbolizer,
    kernel: KernelSymbols,
    kernel_mapping: Arc<FrameMapping>,
    /// (file, file offset) to name; `None` caches a miss.
    names: BoundedCache<(FileIdentity, u64), Option<Arc<str>>>,
    /// ELF objects' symbol indexes, kept across windows.
    objects: SymbolObjects,
    /// Offsets to look up, per file.
    pending: HashMap<FileIdentity, (Arc<MappedFile>, HashSet<u64>)>,
    /// Perf maps checked this window, per pid (`None`: the process has none).
    perf_maps: HashMap<u32, Option<Arc<PerfMap>>>,
    /// Perf maps of the previous window with their file versions: an
    /// unchanged file is not parsed again (a large map costs once).
    previous_perf_maps: HashMap<u32, (PerfMapVersion, Arc<PerfMap>)>,
    /// Versions of the maps in `perf_maps`.
    perf_map_versions: HashMap<u32, PerfMapVersion>,
    /// Objects with more symbol-table bytes than this are not parsed.
    max_symbol_table_bytes: u64,
    /// Objects refused for their symbol tables' size, since the last take.
    refused_objects: u64,
}

/// Default of [`StackSymbolizer::set_max_symbol_table_bytes`], the default
/// of the agent's `--max-symbol-table-bytes`.
pub use kiln_agent_settings::DEFAULT_MAX_SYMBOL_TABLE_BYTES;

/// Most bytes of symbol indexes (and the names read through them) kept
/// across windows: room for the libraries of a few compilers (rustc's two
/// take about 5 MiB), which a build looks up in every window; with the
/// unwind cache's 24 MiB it keeps the agent within 64 MiB.
const SYMBOL_INDEX_BUDGET: u64 = 12 << 20;

impl StackSymbolizer {
    /// A symbolizer with kernel symbols and a bound on cached names.
    pub fn new(kernel: KernelSymbols, max_cached_names: usize) -> StackSymbolizer {
        StackSymbolizer {
            blaze: new_blaze_symbolizer(),
            kernel,
            kernel_mapping: Arc::new(FrameMapping {
                start: 0,
                end: u64::MAX,
                file_offset: 0,
                name: KERNEL_MAPPING_NAME.to_owned(),
                build_id: String::new(),
            }),
            names: BoundedCache::new(max_cached_names),
            objects: SymbolObjects::new(SYMBOL_INDEX_BUDGET),
            pending: HashMap::new(),
            perf_maps: HashMap::new(),
            previous_perf_maps: HashMap::new(),
            perf_map_versions: HashMap::new(),
            max_symbol_table_bytes: DEFAULT_MAX_SYMBOL_TABLE_BYTES,
            refused_objects: 0,
        }
    }

    /// Objects whose symbol tables (with their strings) hold more bytes
    /// than `bytes` keep their frames unsymbolized (mapping, address and
    /// build id), instead of being parsed.
    pub fn set_max_symbol_table_bytes(&mut self, bytes: u64) {
        self.max_symbol_table_bytes = bytes;
    }

    /// ELF objects' symbol tables indexed since start, objects dropped for
    /// the budget since start, and bytes of indexes and names held now.
    pub fn object_totals(&self) -> (u64, u64, u64) {
        (
            self.objects.loads(),
            self.objects.evictions(),
            self.objects.held_bytes(),
        )
    }

    /// Objects refused for their symbol tables since the last call.
    pub fn take_refused_objects(&mut self) -> u64 {
        std::mem::take(&mut self.refused_objects)
    }

    /// Ends a window: drops blazesym's per-process state (the vDSO) and
    /// the ELF objects not looked up for a few windows.
    pub fn reset_file_state(&mut self) {
        self.blaze = new_blaze_symbolizer();
        self.objects.end_window();
        // Perf maps grow as code is compiled: checked again next window, and
        // parsed again only if their file changed. Only the processes seen
        // this window are kept.
        let versions = std::mem::take(&mut self.perf_map_versions);
        self.previous_perf_maps = self
            .perf_maps
            .drain()
            .filter_map(|(pid, map)| Some((pid, (*versions.get(&pid)?, map?))))
            .collect();
    }

    /// Number of kernel symbols loaded.
    pub fn kernel_symbol_count(&self) -> usize {
        self.kernel.len()
    }

    /// Kernel frames, leaf first.
    pub fn kernel_frames(&mut self, ips: &[u64], stats: &mut SymbolizationStats) -> Vec<Frame> {
        call_site_addresses(ips)
            .map(|address| {
                let function = self.kernel.lookup(address).map(intern);
                tally(stats, function.is_some());
                Frame {
                    address,
                    mapping: Some(Arc::clone(&self.kernel_mapping)),
                    function,
                    file: None,
                    line: 0,
                }
            })
            .collect()
    }

    /// User frames of many stacks of one process, leaf first per stack.
    /// Looks names up in batches per file; `process` is `None` when the
    /// process was never seen alive (frames then keep only their address).
    pub fn user_frames(
        &mut self,
        process: Option<&ProcessSnapshot>,
        stacks: &[&[u64]],
        stats: &mut SymbolizationStats,
    ) -> Vec<Vec<Frame>> {
        let Some(process) = process else {
            return stacks
                .iter()
                .map(|ips| {
                    call_site_addresses(ips)
                        .map(|address| {
                            tally(stats, false);
                            Frame {
                                address,
                                mapping: None,
                                function: None,
                                file: None,
                                line: 0,
                            }
                        })
                        .collect()
                })
                .collect();
        };
        let mappings: Vec<Arc<FrameMapping>> = process
            .maps
            .iter()
            .zip(&process.files)
            .map(|(entry, file)| {
                Arc::new(FrameMapping {
                    start: entry.start,
                    end: entry.end,
                    file_offset: entry.file_offset,
                    name: entry.display_name().to_owned(),
                    build_id: file
                        .as_ref()
                        .map(|f| f.build_id.clone())
                        .unwrap_or_default(),
                })
            })
            .collect();
        // Normally queued and run for the whole window already; this catches
        // names evicted since and direct callers.
        self.queue_user_lookups(process, stacks);
        self.run_queued_lookups();
        let jit_names = self.jit_names(process, stacks);
        stacks
            .iter()
            .map(|ips| {
                call_site_addresses(ips)
                    .map(|address| {
                        let index = proc_maps::find_mapping(&process.maps, address);
                        let function = match index.map(|i| (i, &process.files[i])) {
                            Some((i, Some(file))) => {
                                let offset = process.maps[i].file_offset_of(address);
                                self.names.get(&(file.identity, offset)).cloned().flatten()
                            }
                            // Anonymous code, or code in no mapping of the
                            // snapshot (JIT code unmapped and mapped again
                            // between the maps' read and the sample): the
                            // process's perf map may name it.
                            Some((_, None)) | None => jit_names.get(&address).cloned(),
                        };
                        tally(stats, function.is_some());
                        Frame {
                            address,
                            mapping: index.map(|i| Arc::clone(&mappings[i])),
                            function,
                            file: None,
                            line: 0,
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Queues every (file, offset) of `stacks` whose name is not cached yet.
    /// [`StackSymbolizer::run_queued_lookups`] then reads each file once,
    /// however many processes and windows' stacks point into it.
    pub fn queue_user_lookups(&mut self, process: &ProcessSnapshot, stacks: &[&[u64]]) {
        for ips in stacks {
            for address in call_site_addresses(ips) {
                let Some(index) = proc_maps::find_mapping(&process.maps, address) else {
                    continue;
                };
                let Some(file) = &process.files[index] else {
                    continue;
                };
                let offset = process.maps[index].file_offset_of(address);
                if self.names.contains(&(file.identity, offset)) {
                    continue;
                }
                self.pending
                    .entry(file.identity)
                    .or_insert_with(|| (Arc::clone(file), HashSet::new()))
                    .1
                    .insert(offset);
            }
        }
    }

    /// Looks up every queued (file, offset), one index per file, and
    /// caches the names (misses too).
    pub fn run_queued_lookups(&mut self) {
        for (identity, (file, offsets)) in std::mem::take(&mut self.pending) {
            let offsets: Vec<u64> = offsets.into_iter().collect();
            let names =
                match self
                    .objects
                    .names(identity, &file, self.max_symbol_table_bytes, &offsets)
                {
                    Ok(names) => names,
                    Err(error) => {
                        if let ElfSymbolsError::TooLarge { .. } = error {
                            tracing::info!(path = %file.path, %error,
                                "symbol tables over the cap: frames keep their addresses");
                            self.refused_objects += 1;
                        } else {
                            tracing::debug!(path = %file.path, %error, "ELF symbols not indexed");
                        }
                        vec![None; offsets.len()]
                    }
                };
            for (offset, name) in offsets.into_iter().zip(names) {
                self.names.insert((identity, offset), name);
            }
        }
    }

    /// Names of addresses in anonymous or special mappings (JIT code named
    /// by a perf map, the vDSO), asked of the live process.
    fn jit_names(
        &mut self,
        process: &ProcessSnapshot,
        stacks: &[&[u64]],
    ) -> HashMap<u64, Arc<str>> {
        let addresses: Vec<u64> = stacks
            .iter()
            .flat_map(|ips| call_site_addresses(ips))
            // Only addresses no open ELF file covers: anonymous JIT code,
            // the vDSO, or files that could not be opened.
            .filter(
                |&address| match proc_maps::find_mapping(&process.maps, address) {
                    Some(i) => process.files[i].is_none(),
                    None => true,
                },
            )
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let Some(pid) = std::num::NonZeroU32::new(process.pid) else {
            return HashMap::new();
        };
        if addresses.is_empty() {
            return HashMap::new();
        }
        // Anonymous executable memory is JIT code: named by the process's
        // perf map, read by the agent's own bounded, root-confined reader.
        let mut named = HashMap::new();
        let perf_map = self.perf_map(process.pid);
        let mut rest = Vec::new();
        for address in addresses {
            let kind =
                proc_maps::find_mapping(&process.maps, address).map(|i| &process.maps[i].kind);
            match kind {
                None | Some(MappingKind::Anonymous) => {
                    if let Some(name) = perf_map.as_ref().and_then(|m| m.lookup(address)) {
                        named.insert(address, name);
                    }
                }
                Some(MappingKind::Special(name)) if name == "[vdso]" => rest.push(address),
                // A file the agent refused or could not open (over a cap, not
                // a regular file, the open-file budget spent) stays unnamed:
                // handing it to blazesym would open and parse it past every
                // check of `process_info`, and a hostile container could then
                // hang the collector on a FIFO, reach host files through a
                // symlink, or exhaust memory or descriptors with a huge ELF.
                Some(_) => {}
            }
        }
        if rest.is_empty() {
            return named;
        }
        // The vDSO, through the live process; blazesym's own perf-map
        // reading stays off.
        let mut source = blaze_source::Process::new(blazesym::Pid::Pid(pid));
        source.debug_syms = false;
        source.map_files = true;
        source.perf_map = false;
        let Ok(results) = self
            .blaze
            .symbolize(&Source::Process(source), Input::AbsAddr(&rest))
        else {
            return named;
        };
        for (&address, result) in rest.iter().zip(results.iter()) {
            if let Some(symbol) = result.as_sym() {
                named.insert(address, intern(&symbol.name));
            }
        }
        named
    }

    /// The perf map of a process, read once per window.
    fn perf_map(&mut self, pid: u32) -> Option<Arc<PerfMap>> {
        if let Some(map) = self.perf_maps.get(&pid) {
            return map.clone();
        }
        let previous = self.previous_perf_maps.get(&pid).cloned();
        let map = match read_process_perf_map(
            pid,
            &PerfMapLimits::default(),
            previous.as_ref().map(|p| p.0),
        ) {
            Ok(PerfMapRead::Missing) => None,
            Ok(PerfMapRead::Unchanged) => previous.map(|(version, map)| {
                self.perf_map_versions.insert(pid, version);
                map
            }),
            Ok(PerfMapRead::Read(map, version)) => {
                self.perf_map_versions.insert(pid, version);
                Some(Arc::new(map))
            }
            Err(error) => {
                tracing::debug!(pid, %error, "perf map not read");
                None
            }
        };
        self.perf_maps.insert(pid, map.clone());
        map
    }
}

fn intern(name: &str) -> Arc<str> {
    Arc::from(name)
}

fn tally(stats: &mut SymbolizationStats, symbolized: bool) {
    if symbolized {
        stats.symbolized += 1;
    } else {
        stats.unsymbolized += 1;
    }
}

/// A blazesym symbolizer for the vDSO's ELF symbols, names demangled.
fn new_blaze_symbolizer() -> blaze::Symbolizer {
    blaze::Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .build()
}

#[cfg(test)]
mod tests;
