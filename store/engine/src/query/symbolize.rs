//! Naming a merge's frames after the merge: the frames that arrived as an
//! address in a mapping with a build id and no function name are listed
//! once each ([`MergedProfile::unsymbolized_addresses`]), resolved by the
//! caller from debug info, and written back into the merge's symbols
//! ([`MergedProfile::apply_symbols`]). Ingest never names them: what was
//! sent is what is stored.

use std::sync::Arc;

use hashbrown::HashSet;

use crate::query::MergedProfile;
use crate::symbols::{Function, Line, Location, Mapping, SymbolTable};

/// One frame a debug file gives an address; several for inlined calls,
/// innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymbolizedFrame {
    /// The function's (demangled) name.
    pub function: String,
    /// The source file, empty when the debug info has none.
    pub file: String,
    /// The source line, 0 when unknown.
    pub line: u32,
}

/// An address to symbolize: a debug file's build id (as sent) and the
/// offset in that file, with the file offset its mapping starts at (which
/// says which of the file's segments was mapped, where the debug file
/// alone no longer records segment offsets).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnsymbolizedAddress {
    /// The mapping's build id.
    pub build_id: String,
    /// The address as an offset in the mapped file.
    pub file_offset: u64,
    /// The file offset the mapping starts at.
    pub mapping_file_offset: u64,
}

/// The offset in the mapped file of `address`, when the mapping says
/// where the file was loaded and holds the address.
pub fn file_offset(mapping: &Mapping, address: u64) -> Option<u64> {
    (mapping.memory_start <= address && address < mapping.memory_limit)
        .then(|| address - mapping.memory_start)
        .and_then(|delta| delta.checked_add(mapping.file_offset))
}

/// True when no line of `location` names a function.
fn lacks_names(symbols: &SymbolTable, location: &Location) -> bool {
    symbols.location_lines(location).iter().all(|line| {
        symbols.function(line.function).is_none_or(|f| {
            symbols.string(f.name).is_empty() && symbols.string(f.system_name).is_empty()
        })
    })
}

/// The build id, file offset and mapping file offset of `location`, when
/// it lacks names and its mapping names a build id and holds its address.
fn symbolizable<'a>(symbols: &'a SymbolTable, location: &Location) -> Option<(&'a str, u64, u64)> {
    let mapping = symbols.mapping(location.mapping)?;
    let build_id = symbols.string(mapping.build_id);
    if build_id.is_empty() || !lacks_names(symbols, location) {
        return None;
    }
    let offset = file_offset(mapping, location.address)?;
    Some((build_id, offset, mapping.file_offset))
}

impl MergedProfile {
    /// Every distinct address of the merge that lacks a function name and
    /// can be looked up (its mapping has a build id and holds it), sorted.
    /// One entry per location, however many samples and stacks hold it.
    pub fn unsymbolized_addresses(&self) -> Vec<UnsymbolizedAddress> {
        let mut seen = HashSet::new();
        for location in &self.symbols.locations {
            if let Some((build_id, file_offset, mapping_file_offset)) =
                symbolizable(&self.symbols, location)
            {
                seen.insert(UnsymbolizedAddress {
                    build_id: build_id.to_owned(),
                    file_offset,
                    mapping_file_offset,
                });
            }
        }
        let mut out: Vec<_> = seen.into_iter().collect();
        out.sort();
        out
    }

    /// Names the frames `resolve` has frames for: each location lacking a
    /// name is offered as (build id, file offset, mapping file offset), one
    /// pass over the merge's locations, and gets the frames `resolve` gives
    /// as its lines (several for inlined calls). Returns how many locations
    /// were named. Addresses that do not resolve keep their
    /// `module+0xoffset` names.
    pub fn apply_symbols(
        &mut self,
        mut resolve: impl FnMut(&str, u64, u64) -> Option<Arc<[SymbolizedFrame]>>,
    ) -> usize {
        let mut named = 0;
        let mut lines = Vec::new();
        for id in 0..self.symbols.locations.len() {
            let frames = match symbolizable(&self.symbols, &self.symbols.locations[id]) {
                Some((build_id, offset, mapping_offset)) => {
                    resolve(build_id, offset, mapping_offset)
                }
                None => continue,
            };
            let Some(frames) = frames.filter(|f| !f.is_empty()) else {
                continue;
            };
            lines.clear();
            for frame in frames.iter() {
                let name = self.symbols.intern_string(&frame.function);
                let filename = self.symbols.intern_string(&frame.file);
                let function = self.symbols.intern_function(Function {
                    name,
                    system_name: name,
                    filename,
                    start_line: 0,
                });
                lines.push(Line {
                    function,
                    line: i64::from(frame.line),
                });
            }
            let id = u32::try_from(id).expect("location ids are u32");
            if self.symbols.replace_location_lines(id, &lines) {
                named += 1;
            }
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::Mapping;

    fn merge_with_frames(build_id: &str, addresses: &[u64]) -> MergedProfile {
        let mut merged = MergedProfile::new();
        let filename = merged.symbols.intern_string("/usr/bin/app");
        let build_id = merged.symbols.intern_string(build_id);
        let mapping = merged.symbols.intern_mapping(Mapping {
            memory_start: 0x5555_0000_0000,
            memory_limit: 0x5555_0010_0000,
            file_offset: 0x1000,
            filename,
            build_id,
            has_functions: false,
        });
        let mut parent = crate::symbols::ROOT_NODE;
        for &address in addresses {
            let location = merged.symbols.intern_location(mapping, address, &[]);
            parent = merged.symbols.intern_node(parent, location);
        }
        merged.values.insert((parent, 0), 7);
        merged.total = 7;
        merged
    }

    #[test]
    fn unnamed_frames_are_listed_once_by_build_id_and_file_offset() {
        let merged = merge_with_frames("abcd", &[0x5555_0000_0010, 0x5555_0000_0020]);
        let addresses = merged.unsymbolized_addresses();
        assert_eq!(
            addresses,
            [0x1010, 0x1020].map(|file_offset| UnsymbolizedAddress {
                build_id: "abcd".to_owned(),
                file_offset,
                mapping_file_offset: 0x1000,
            })
        );
        assert_eq!(
            merged.stacks(),
            [(vec!["app+0x1020".to_owned(), "app+0x1010".to_owned()], 7)]
        );
    }

    #[test]
    fn frames_without_a_build_id_are_not_listed() {
        let merged = merge_with_frames("", &[0x5555_0000_0010]);
        assert!(merged.unsymbolized_addresses().is_empty());
    }

    #[test]
    fn resolved_addresses_get_their_inlined_frames_and_others_keep_their_offsets() {
        let mut merged = merge_with_frames("abcd", &[0x5555_0000_0010, 0x5555_0000_0020]);
        let frames: Arc<[SymbolizedFrame]> = Arc::from(vec![
            SymbolizedFrame {
                function: "inner".to_owned(),
                file: "app.c".to_owned(),
                line: 12,
            },
            SymbolizedFrame {
                function: "outer".to_owned(),
                file: "app.c".to_owned(),
                line: 40,
            },
        ]);
        let named = merged.apply_symbols(|build_id, offset, mapping_offset| {
            assert_eq!((build_id, mapping_offset), ("abcd", 0x1000));
            (offset == 0x1010).then(|| Arc::clone(&frames))
        });
        assert_eq!(named, 1);
        assert_eq!(
            merged.stacks(),
            [(
                vec![
                    "app+0x1020".to_owned(),
                    "inner".to_owned(),
                    "outer".to_owned()
                ],
                7
            )]
        );
        assert_eq!(merged.unsymbolized_addresses().len(), 1);
        let profile_type =
            crate::model::ProfileType::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
        let pprof = merged.to_pprof(&profile_type);
        let named_lines: Vec<i64> = pprof
            .location
            .iter()
            .flat_map(|l| l.line.iter().map(|line| line.line))
            .collect();
        assert_eq!(named_lines, [12, 40]);
    }
}
