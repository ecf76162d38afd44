//! Reading a pprof message's fields straight from the wire into flat
//! tables: one vector per kind of entry, nested lists (a sample's location
//! ids, values and labels, a location's lines) as ranges of shared vectors,
//! and strings as slices of the input. Field numbers and wire types are
//! those of `proto/profile.proto`, read as prost reads them: repeated
//! scalars packed or not, a repeated `period_type` merged field by field,
//! the last occurrence of a scalar winning, unknown fields skipped.

use super::wire::{Cursor, RECURSION_LIMIT, int64, malformed};
use crate::error::PprofError;
use crate::prescan::TableCounts;
use crate::proto;

/// One sample: where its lists end in the shared vectors (each starts
/// where the previous sample's ends).
#[derive(Debug, Clone, Copy)]
pub(super) struct SampleEnds {
    pub(super) location_ids: usize,
    pub(super) values: usize,
    pub(super) labels: usize,
}

/// One location, its lines ending at `lines_end` in the shared vector.
#[derive(Debug, Clone, Copy)]
pub(super) struct LocationEntry {
    pub(super) id: u64,
    pub(super) mapping_id: u64,
    pub(super) address: u64,
    pub(super) is_folded: bool,
    pub(super) lines_end: usize,
}

/// Everything one message holds, strings still borrowed from the input.
#[derive(Debug, Default)]
pub(super) struct Parts<'a> {
    pub(super) sample_types: Vec<proto::ValueType>,
    pub(super) samples: Vec<SampleEnds>,
    pub(super) location_ids: Vec<u64>,
    pub(super) values: Vec<i64>,
    pub(super) labels: Vec<proto::Label>,
    pub(super) mappings: Vec<proto::Mapping>,
    pub(super) locations: Vec<LocationEntry>,
    pub(super) lines: Vec<proto::Line>,
    pub(super) functions: Vec<proto::Function>,
    pub(super) strings: Vec<&'a [u8]>,
    pub(super) drop_frames: i64,
    pub(super) keep_frames: i64,
    pub(super) time_nanos: i64,
    pub(super) duration_nanos: i64,
    pub(super) period_type: Option<proto::ValueType>,
    pub(super) period: i64,
    pub(super) comments: Vec<i64>,
    pub(super) default_sample_type: i64,
    pub(super) doc_url: i64,
}

/// Reads a whole `Profile` message.
/// `tables` sizes the tables and the nested lists; the scan that counted
/// them also checked each against its limit.
pub(super) fn profile(bytes: &[u8], tables: TableCounts) -> Result<Parts<'_>, PprofError> {
    let mut parts = Parts {
        samples: Vec::with_capacity(tables.samples),
        location_ids: Vec::with_capacity(tables.location_ids),
        values: Vec::with_capacity(tables.values),
        labels: Vec::with_capacity(tables.labels),
        lines: Vec::with_capacity(tables.lines),
        mappings: Vec::with_capacity(tables.mappings),
        locations: Vec::with_capacity(tables.locations),
        functions: Vec::with_capacity(tables.functions),
        strings: Vec::with_capacity(tables.strings),
        ..Parts::default()
    };
    let mut cursor = Cursor::new(bytes);
    let depth = RECURSION_LIMIT;
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => {
                let mut value_type = proto::ValueType::default();
                value_type_fields(cursor.message(wire_type)?, &mut value_type, depth - 1)?;
                parts.sample_types.push(value_type);
            }
            2 => sample(cursor.message(wire_type)?, &mut parts, depth - 1)?,
            3 => parts
                .mappings
                .push(mapping(cursor.message(wire_type)?, depth - 1)?),
            4 => location(cursor.message(wire_type)?, &mut parts, depth - 1)?,
            5 => parts
                .functions
                .push(function(cursor.message(wire_type)?, depth - 1)?),
            6 => {
                if wire_type != super::wire::LENGTH_DELIMITED {
                    return Err(malformed("invalid wire type for a bytes field"));
                }
                parts.strings.push(cursor.delimited()?);
            }
            7 => parts.drop_frames = int64(cursor.scalar(wire_type)?),
            8 => parts.keep_frames = int64(cursor.scalar(wire_type)?),
            9 => parts.time_nanos = int64(cursor.scalar(wire_type)?),
            10 => parts.duration_nanos = int64(cursor.scalar(wire_type)?),
            11 => {
                // A singular message seen twice is merged, as prost does.
                let value_type = parts.period_type.get_or_insert_default();
                value_type_fields(cursor.message(wire_type)?, value_type, depth - 1)?;
            }
            12 => parts.period = int64(cursor.scalar(wire_type)?),
            13 => cursor.repeated(wire_type, &mut parts.comments, int64)?,
            14 => parts.default_sample_type = int64(cursor.scalar(wire_type)?),
            15 => parts.doc_url = int64(cursor.scalar(wire_type)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(parts)
}

fn value_type_fields(
    bytes: &[u8],
    value_type: &mut proto::ValueType,
    depth: u32,
) -> Result<(), PprofError> {
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => value_type.r#type = int64(cursor.scalar(wire_type)?),
            2 => value_type.unit = int64(cursor.scalar(wire_type)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(())
}

fn sample(bytes: &[u8], parts: &mut Parts<'_>, depth: u32) -> Result<(), PprofError> {
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => cursor.repeated(wire_type, &mut parts.location_ids, |id| id)?,
            2 => cursor.repeated(wire_type, &mut parts.values, int64)?,
            3 => parts
                .labels
                .push(label(cursor.message(wire_type)?, depth - 1)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    parts.samples.push(SampleEnds {
        location_ids: parts.location_ids.len(),
        values: parts.values.len(),
        labels: parts.labels.len(),
    });
    Ok(())
}

fn label(bytes: &[u8], depth: u32) -> Result<proto::Label, PprofError> {
    let mut label = proto::Label::default();
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => label.key = int64(cursor.scalar(wire_type)?),
            2 => label.str = int64(cursor.scalar(wire_type)?),
            3 => label.num = int64(cursor.scalar(wire_type)?),
            4 => label.num_unit = int64(cursor.scalar(wire_type)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(label)
}

fn mapping(bytes: &[u8], depth: u32) -> Result<proto::Mapping, PprofError> {
    let mut mapping = proto::Mapping::default();
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => mapping.id = cursor.scalar(wire_type)?,
            2 => mapping.memory_start = cursor.scalar(wire_type)?,
            3 => mapping.memory_limit = cursor.scalar(wire_type)?,
            4 => mapping.file_offset = cursor.scalar(wire_type)?,
            5 => mapping.filename = int64(cursor.scalar(wire_type)?),
            6 => mapping.build_id = int64(cursor.scalar(wire_type)?),
            7 => mapping.has_functions = cursor.scalar(wire_type)? != 0,
            8 => mapping.has_filenames = cursor.scalar(wire_type)? != 0,
            9 => mapping.has_line_numbers = cursor.scalar(wire_type)? != 0,
            10 => mapping.has_inline_frames = cursor.scalar(wire_type)? != 0,
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(mapping)
}

fn location(bytes: &[u8], parts: &mut Parts<'_>, depth: u32) -> Result<(), PprofError> {
    let mut entry = LocationEntry {
        id: 0,
        mapping_id: 0,
        address: 0,
        is_folded: false,
        lines_end: 0,
    };
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => entry.id = cursor.scalar(wire_type)?,
            2 => entry.mapping_id = cursor.scalar(wire_type)?,
            3 => entry.address = cursor.scalar(wire_type)?,
            4 => parts
                .lines
                .push(line(cursor.message(wire_type)?, depth - 1)?),
            5 => entry.is_folded = cursor.scalar(wire_type)? != 0,
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    entry.lines_end = parts.lines.len();
    parts.locations.push(entry);
    Ok(())
}

fn line(bytes: &[u8], depth: u32) -> Result<proto::Line, PprofError> {
    let mut line = proto::Line::default();
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => line.function_id = cursor.scalar(wire_type)?,
            2 => line.line = int64(cursor.scalar(wire_type)?),
            3 => line.column = int64(cursor.scalar(wire_type)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(line)
}

fn function(bytes: &[u8], depth: u32) -> Result<proto::Function, PprofError> {
    let mut function = proto::Function::default();
    let mut cursor = Cursor::new(bytes);
    while !cursor.is_empty() {
        let (field, wire_type) = cursor.key()?;
        match field {
            1 => function.id = cursor.scalar(wire_type)?,
            2 => function.name = int64(cursor.scalar(wire_type)?),
            3 => function.system_name = int64(cursor.scalar(wire_type)?),
            4 => function.filename = int64(cursor.scalar(wire_type)?),
            5 => function.start_line = int64(cursor.scalar(wire_type)?),
            _ => cursor.skip(field, wire_type, depth)?,
        }
    }
    Ok(function)
}
