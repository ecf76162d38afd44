//! Encoding and checked decoding of the symbol-table sections.
//! Decoding validates every reference, so later lookups cannot go astray.

use crate::error::BlockError;
use crate::symbols::{
    Function, Line, Location, Mapping, NO_MAPPING, ROOT_NODE, SampleLabel, StackNode, SymbolTable,
    decoded_location,
};
use crate::wire::{Reader, WireError, Writer};

fn corrupt(what: &'static str) -> impl Fn(WireError) -> BlockError {
    move |_| BlockError::Corrupt { what }
}

fn check(ok: bool, what: &'static str) -> Result<(), BlockError> {
    if ok {
        Ok(())
    } else {
        Err(BlockError::Corrupt { what })
    }
}

/// The encoded symbol sections.
pub(crate) struct EncodedTables {
    pub(crate) strings: Vec<u8>,
    pub(crate) mappings: Vec<u8>,
    pub(crate) functions: Vec<u8>,
    pub(crate) locations: Vec<u8>,
    pub(crate) stacks: Vec<u8>,
    pub(crate) label_sets: Vec<u8>,
}

pub(crate) fn encode_tables(symbols: &SymbolTable) -> EncodedTables {
    let mut strings = Writer::new();
    strings.varint(symbols.strings.len() as u64);
    for s in &symbols.strings {
        strings.bytes(s.as_bytes());
    }
    let mut mappings = Writer::new();
    mappings.varint(symbols.mappings.len() as u64);
    for m in &symbols.mappings {
        mappings.varint(m.memory_start);
        mappings.varint(m.memory_limit);
        mappings.varint(m.file_offset);
        mappings.varint(u64::from(m.filename));
        mappings.varint(u64::from(m.build_id));
        mappings.byte(u8::from(m.has_functions));
    }
    let mut functions = Writer::new();
    functions.varint(symbols.functions.len() as u64);
    for f in &symbols.functions {
        functions.varint(u64::from(f.name));
        functions.varint(u64::from(f.system_name));
        functions.varint(u64::from(f.filename));
        functions.signed(f.start_line);
    }
    let mut locations = Writer::new();
    locations.varint(symbols.locations.len() as u64);
    for location in &symbols.locations {
        let mapping = if location.mapping == NO_MAPPING {
            0
        } else {
            u64::from(location.mapping) + 1
        };
        locations.varint(mapping);
        locations.varint(location.address);
        let lines = symbols.location_lines(location);
        locations.varint(lines.len() as u64);
        for line in lines {
            locations.varint(u64::from(line.function));
            locations.signed(line.line);
        }
    }
    let mut stacks = Writer::new();
    stacks.varint(symbols.nodes.len().saturating_sub(1) as u64);
    for (id, node) in symbols.nodes.iter().enumerate().skip(1) {
        // Parent deltas are small: children are interned right after parents.
        stacks.varint(id as u64 - u64::from(node.parent));
        stacks.varint(u64::from(node.location));
    }
    let mut label_sets = Writer::new();
    label_sets.varint(symbols.label_sets.len().saturating_sub(1) as u64);
    for set in symbols.label_sets.iter().skip(1) {
        label_sets.varint(set.len() as u64);
        for label in set.iter() {
            label_sets.varint(u64::from(label.key));
            label_sets.varint(u64::from(label.str));
            label_sets.signed(label.num);
            label_sets.varint(u64::from(label.unit));
        }
    }
    EncodedTables {
        strings: strings.into_vec(),
        mappings: mappings.into_vec(),
        functions: functions.into_vec(),
        locations: locations.into_vec(),
        stacks: stacks.into_vec(),
        label_sets: label_sets.into_vec(),
    }
}

/// Raw section bytes to decode into a table.
pub(crate) struct TableSections<'a> {
    pub(crate) strings: &'a [u8],
    pub(crate) mappings: &'a [u8],
    pub(crate) functions: &'a [u8],
    pub(crate) locations: &'a [u8],
    pub(crate) stacks: &'a [u8],
    pub(crate) label_sets: &'a [u8],
}

/// Reads a block's six symbol sections through `section` and decodes them:
/// the one path for a block decoded whole and one opened by range.
pub(crate) fn decode_symbol_sections<S: AsRef<[u8]>>(
    mut section: impl FnMut(super::format::SectionKind) -> Result<S, BlockError>,
) -> Result<SymbolTable, BlockError> {
    use super::format::SectionKind;
    let strings = section(SectionKind::Strings)?;
    let mappings = section(SectionKind::Mappings)?;
    let functions = section(SectionKind::Functions)?;
    let locations = section(SectionKind::Locations)?;
    let stacks = section(SectionKind::Stacks)?;
    let label_sets = section(SectionKind::LabelSets)?;
    decode_tables(&TableSections {
        strings: strings.as_ref(),
        mappings: mappings.as_ref(),
        functions: functions.as_ref(),
        locations: locations.as_ref(),
        stacks: stacks.as_ref(),
        label_sets: label_sets.as_ref(),
    })
}

pub(crate) fn decode_tables(sections: &TableSections<'_>) -> Result<SymbolTable, BlockError> {
    let strings = decode_strings(sections.strings)?;
    let string_ok = |id: u32| (id as usize) < strings.len();

    let what = "mappings";
    let mut r = Reader::new(sections.mappings);
    let count = r.count(6).map_err(corrupt(what))?;
    let mut mappings = Vec::with_capacity(count);
    for _ in 0..count {
        let mapping = Mapping {
            memory_start: r.varint().map_err(corrupt(what))?,
            memory_limit: r.varint().map_err(corrupt(what))?,
            file_offset: r.varint().map_err(corrupt(what))?,
            filename: r.u32().map_err(corrupt(what))?,
            build_id: r.u32().map_err(corrupt(what))?,
            has_functions: r.byte().map_err(corrupt(what))? != 0,
        };
        check(
            string_ok(mapping.filename) && string_ok(mapping.build_id),
            what,
        )?;
        mappings.push(mapping);
    }

    let what = "functions";
    let mut r = Reader::new(sections.functions);
    let count = r.count(4).map_err(corrupt(what))?;
    let mut functions = Vec::with_capacity(count);
    for _ in 0..count {
        let function = Function {
            name: r.u32().map_err(corrupt(what))?,
            system_name: r.u32().map_err(corrupt(what))?,
            filename: r.u32().map_err(corrupt(what))?,
            start_line: r.signed().map_err(corrupt(what))?,
        };
        check(
            string_ok(function.name)
                && string_ok(function.system_name)
                && string_ok(function.filename),
            what,
        )?;
        functions.push(function);
    }

    let what = "locations";
    let mut r = Reader::new(sections.locations);
    let count = r.count(3).map_err(corrupt(what))?;
    let mut locations: Vec<Location> = Vec::with_capacity(count);
    let mut lines: Vec<Line> = Vec::new();
    for _ in 0..count {
        let mapping = r.u32().map_err(corrupt(what))?;
        let mapping = match mapping.checked_sub(1) {
            None => NO_MAPPING,
            Some(m) => {
                check((m as usize) < mappings.len(), what)?;
                m
            }
        };
        let address = r.varint().map_err(corrupt(what))?;
        let line_count = r.count(2).map_err(corrupt(what))?;
        let start = u32::try_from(lines.len()).map_err(|_| BlockError::Corrupt { what })?;
        for _ in 0..line_count {
            let line = Line {
                function: r.u32().map_err(corrupt(what))?,
                line: r.signed().map_err(corrupt(what))?,
            };
            check((line.function as usize) < functions.len(), what)?;
            lines.push(line);
        }
        locations.push(decoded_location(mapping, address, start, line_count as u32));
    }

    let what = "stacks";
    let mut r = Reader::new(sections.stacks);
    let count = r.count(2).map_err(corrupt(what))?;
    let mut nodes = Vec::with_capacity(count + 1);
    nodes.push(StackNode {
        parent: ROOT_NODE,
        location: 0,
    });
    for id in 1..=count as u64 {
        let delta = r.varint().map_err(corrupt(what))?;
        // Parents strictly precede children, so stacks cannot form cycles.
        check(delta >= 1 && delta <= id, what)?;
        let location = r.u32().map_err(corrupt(what))?;
        check((location as usize) < locations.len(), what)?;
        nodes.push(StackNode {
            parent: (id - delta) as u32,
            location,
        });
    }

    let what = "label sets";
    let mut r = Reader::new(sections.label_sets);
    let count = r.count(1).map_err(corrupt(what))?;
    let mut label_sets: Vec<Box<[SampleLabel]>> = Vec::with_capacity(count + 1);
    label_sets.push(Box::default());
    for _ in 0..count {
        let n = r.count(4).map_err(corrupt(what))?;
        let mut set = Vec::with_capacity(n);
        for _ in 0..n {
            let label = SampleLabel {
                key: r.u32().map_err(corrupt(what))?,
                str: r.u32().map_err(corrupt(what))?,
                num: r.signed().map_err(corrupt(what))?,
                unit: r.u32().map_err(corrupt(what))?,
            };
            check(
                string_ok(label.key) && string_ok(label.str) && string_ok(label.unit),
                what,
            )?;
            set.push(label);
        }
        label_sets.push(set.into());
    }

    Ok(SymbolTable::from_decoded(
        strings, mappings, functions, locations, lines, nodes, label_sets,
    ))
}

fn decode_strings(bytes: &[u8]) -> Result<Vec<Box<str>>, BlockError> {
    let what = "strings";
    let mut r = Reader::new(bytes);
    let count = r.count(1).map_err(corrupt(what))?;
    let mut strings: Vec<Box<str>> = Vec::with_capacity(count);
    for _ in 0..count {
        let raw = r.bytes().map_err(corrupt(what))?;
        let s = std::str::from_utf8(raw).map_err(|_| BlockError::Corrupt { what })?;
        strings.push(Box::from(s));
    }
    check(strings.first().is_some_and(|s| s.is_empty()), what)?;
    Ok(strings)
}
