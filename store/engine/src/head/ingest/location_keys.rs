//! Content keys of a profile's locations, computed from the profile alone,
//! so that ingest finds a location the head already holds with one lookup,
//! without first interning its mapping, its functions and their strings.
//!
//! NB: those lookups into head tables of tens of thousands of entries,
//! each a cache miss (the string ones also comparing bytes behind another
//! pointer), were most of ingest's CPU; almost every location of an upload
//! is one its process sent before.
//!
//! A key is SipHash-1-3 with a 128-bit output under keys drawn once per
//! process: two locations get one key exactly when full interning would
//! give them one id (same mapping content, address and lines, the
//! functions and mappings compared by their strings' content), except for
//! a collision that nobody outside the process can aim at.

use std::hash::Hasher;

use hashbrown::HashMap;
use kiln_pprof::ProfileView;
use kiln_pprof::flat::LocationRef;
use siphasher::sip128::Hasher128;

use crate::symbols::content_hasher;

/// The content key of a location.
pub(crate) type LocationContentKey = u128;

/// Marks a memo slot not computed yet. A real key of 0 is only recomputed.
const NOT_YET: u128 = 0;

fn key_of(bytes: &[u8]) -> u128 {
    let mut h = content_hasher();
    h.write(bytes);
    h.finish128().as_u128()
}

/// Per-profile memo of the keys of strings, functions and mappings, so a
/// string shared by many functions is hashed once.
pub(super) struct LocationKeys {
    strings: Vec<u128>,
    functions: Vec<u128>,
    mappings: HashMap<u64, u128>,
    /// Scratch for a location's record.
    record: Vec<u8>,
}

impl LocationKeys {
    pub(super) fn new(profile: &impl ProfileView) -> Self {
        Self {
            strings: vec![NOT_YET; profile.string_count()],
            functions: vec![NOT_YET; profile.function_count()],
            mappings: HashMap::new(),
            record: Vec::new(),
        }
    }

    /// An index out of range keys as `""`, as interning reads it.
    fn string(&mut self, profile: &impl ProfileView, index: i64) -> u128 {
        let slot = usize::try_from(index)
            .ok()
            .filter(|&i| i < self.strings.len());
        if let Some(i) = slot
            && self.strings[i] != NOT_YET
        {
            return self.strings[i];
        }
        // Every input starts with a byte naming its kind ('s', 'f', 'm',
        // 'n', 'l'), so a string never hashes as the record of another kind.
        let mut h = content_hasher();
        h.write_u8(b's');
        h.write(profile.string(index).as_bytes());
        let key = h.finish128().as_u128();
        if let Some(i) = slot {
            self.strings[i] = key;
        }
        key
    }

    /// `None` for an id that does not resolve: interning reads it as
    /// function 0, whatever that is, so there is no content to key.
    fn function(&mut self, profile: &impl ProfileView, id: u64) -> Option<u128> {
        let position = profile.function_position(id)?;
        let cached = *self.functions.get(position)?;
        if cached != NOT_YET {
            return Some(cached);
        }
        let f = profile.function_at(position)?;
        // One `write` of the whole record: SipHash then runs its word loop
        // once instead of buffering a few bytes per call.
        let mut record = [0u8; 57];
        record[0] = b'f';
        record[1..17].copy_from_slice(&self.string(profile, f.name).to_le_bytes());
        record[17..33].copy_from_slice(&self.string(profile, f.system_name).to_le_bytes());
        record[33..49].copy_from_slice(&self.string(profile, f.filename).to_le_bytes());
        record[49..57].copy_from_slice(&f.start_line.to_le_bytes());
        let key = key_of(&record);
        self.functions[position] = key;
        Some(key)
    }

    /// A mapping id that does not resolve (0 included) keys as "no
    /// mapping", as interning reads it.
    fn mapping(&mut self, profile: &impl ProfileView, id: u64) -> u128 {
        if let Some(&key) = self.mappings.get(&id) {
            return key;
        }
        let key = match profile.mapping(id) {
            None => key_of(b"n"),
            Some(m) => {
                let mut record = [0u8; 58];
                record[0] = b'm';
                record[1..9].copy_from_slice(&m.memory_start.to_le_bytes());
                record[9..17].copy_from_slice(&m.memory_limit.to_le_bytes());
                record[17..25].copy_from_slice(&m.file_offset.to_le_bytes());
                record[25..41].copy_from_slice(&self.string(profile, m.filename).to_le_bytes());
                record[41..57].copy_from_slice(&self.string(profile, m.build_id).to_le_bytes());
                record[57] = u8::from(m.has_functions);
                key_of(&record)
            }
        };
        self.mappings.insert(id, key);
        key
    }

    /// The key of `location`, or `None` when one of its functions does not
    /// resolve (validation rules that out).
    pub(super) fn location(
        &mut self,
        profile: &impl ProfileView,
        location: &LocationRef<'_>,
    ) -> Option<LocationContentKey> {
        let mapping = self.mapping(profile, location.mapping_id);
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        record.push(b'l');
        record.extend_from_slice(&mapping.to_le_bytes());
        record.extend_from_slice(&location.address.to_le_bytes());
        record.extend_from_slice(&(location.lines.len() as u64).to_le_bytes());
        let mut complete = true;
        for line in location.lines {
            let Some(function) = self.function(profile, line.function_id) else {
                complete = false;
                break;
            };
            record.extend_from_slice(&function.to_le_bytes());
            record.extend_from_slice(&line.line.to_le_bytes());
        }
        let key = complete.then(|| key_of(&record));
        self.record = record;
        key
    }
}

#[cfg(test)]
mod tests {
    use kiln_pprof::{DecodeLimits, FunctionSpec, MappingSpec, Profile, ProfileBuilder};

    use crate::head::Head;
    use crate::model::{Label, LabelSet};

    #[derive(Clone)]
    struct Frame {
        mapping: Option<MappingSpec>,
        address: u64,
        lines: Vec<(FunctionSpec, i64)>,
    }

    fn function(name: &str) -> FunctionSpec {
        FunctionSpec {
            name: name.into(),
            system_name: format!("_Z{name}"),
            filename: "src/work.rs".into(),
            start_line: 10,
        }
    }

    fn base() -> Vec<Frame> {
        let binary = MappingSpec {
            memory_start: 0x40_0000,
            memory_limit: 0x80_0000,
            file_offset: 0x1000,
            filename: "/usr/bin/app".into(),
            build_id: "abc123".into(),
            has_functions: true,
        };
        vec![
            Frame {
                mapping: Some(binary.clone()),
                address: 0x40_1234,
                lines: vec![(function("work"), 12), (function("inlined_caller"), 40)],
            },
            Frame {
                mapping: Some(binary),
                address: 0x40_2000,
                lines: vec![(function("main"), 3)],
            },
            Frame {
                mapping: None,
                address: 0x7000,
                lines: vec![],
            },
        ]
    }

    /// One sample on `frames` (leaf first). `padding` unreferenced strings,
    /// functions, mappings and locations come first, so every id and string
    /// index differs from an unpadded profile of the same content.
    fn profile_of(frames: &[Frame], padding: usize) -> Profile {
        let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        for i in 0..padding {
            b.string(&format!("unused-{i}"));
            let pad = b.function(&function(&format!("pad{i}")));
            let m = b.mapping(&MappingSpec {
                filename: format!("/pad/{i}"),
                ..MappingSpec::default()
            });
            b.location(m, 0x9000 + i as u64, &[(pad, 1)]);
        }
        let locations: Vec<u64> = frames
            .iter()
            .map(|frame| {
                let mapping = frame.mapping.as_ref().map_or(0, |m| b.mapping(m));
                let lines: Vec<(u64, i64)> = frame
                    .lines
                    .iter()
                    .map(|(f, line)| (b.function(f), *line))
                    .collect();
                b.location(mapping, frame.address, &lines)
            })
            .collect();
        b.sample(&locations, &[10], &[]);
        let bytes = kiln_pprof::encode_gzip(&b.finish());
        kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("decodes")
    }

    fn ingest(head: &mut Head, profile: &Profile) {
        let labels = LabelSet::new(vec![Label::new("__name__", "process_cpu")]);
        head.ingest(profile, &labels, 1, 10, &crate::IngestLimits::default())
            .expect("ingests");
    }

    #[test]
    fn a_location_sent_again_under_other_ids_is_found_by_its_content() {
        let mut head = Head::new();
        ingest(&mut head, &profile_of(&base(), 0));
        let (locations, functions, strings) = (
            head.symbols.location_count(),
            head.symbols.functions.len(),
            head.symbols.string_count(),
        );
        assert_eq!(locations, 3);
        for padding in [1, 7] {
            ingest(&mut head, &profile_of(&base(), padding));
            assert_eq!(head.symbols.location_count(), locations);
            assert_eq!(head.symbols.functions.len(), functions);
            assert_eq!(head.symbols.string_count(), strings);
        }
    }

    /// Each change to one frame's content makes a location of its own, with
    /// that content: a key that left out any part would find the old one.
    #[test]
    fn a_location_differing_in_any_part_of_its_content_is_a_new_one() {
        type Change = fn(&mut Frame);
        let changes: [(&str, Change); 14] = [
            ("function name", |f| f.lines[0].0.name = "work2".into()),
            ("system name", |f| {
                f.lines[0].0.system_name = "_Zwork2".into()
            }),
            ("source file", |f| {
                f.lines[0].0.filename = "src/other.rs".into()
            }),
            ("start line", |f| f.lines[0].0.start_line = 11),
            ("line", |f| f.lines[0].1 = 13),
            ("inlined caller's line", |f| f.lines[1].1 = 41),
            ("inlining order", |f| f.lines.reverse()),
            ("one line fewer", |f| f.lines.truncate(1)),
            ("address", |f| f.address += 1),
            ("no mapping", |f| f.mapping = None),
            ("mapping file", |f| {
                f.mapping.as_mut().expect("mapped").filename = "/usr/bin/other".into();
            }),
            ("build id", |f| {
                f.mapping.as_mut().expect("mapped").build_id = "def456".into();
            }),
            ("mapping range", |f| {
                f.mapping.as_mut().expect("mapped").memory_limit += 0x1000;
            }),
            ("symbolized flag", |f| {
                f.mapping.as_mut().expect("mapped").has_functions = false;
            }),
        ];
        let mut head = Head::new();
        ingest(&mut head, &profile_of(&base(), 0));
        for (what, change) in changes {
            let mut frames = base();
            change(&mut frames[0]);
            let before = head.symbols.location_count();
            ingest(&mut head, &profile_of(&frames, 3));
            assert_eq!(
                head.symbols.location_count(),
                before + 1,
                "a different {what} is a new location"
            );
            // The new location holds the changed content, read back by id.
            let location = *head
                .symbols
                .location(u32::try_from(before).expect("few locations"))
                .expect("the new location");
            assert_eq!(location.address, frames[0].address, "{what}");
            let names: Vec<&str> = head
                .symbols
                .location_lines(&location)
                .iter()
                .map(|line| {
                    let f = head.symbols.function(line.function).expect("function");
                    head.symbols.string(f.name)
                })
                .collect();
            let expected: Vec<&str> = frames[0]
                .lines
                .iter()
                .map(|(f, _)| f.name.as_str())
                .collect();
            assert_eq!(names, expected, "{what}");
            // Sent again under other ids, it is found.
            ingest(&mut head, &profile_of(&frames, 5));
            assert_eq!(head.symbols.location_count(), before + 1, "{what}, again");
        }
    }
}
