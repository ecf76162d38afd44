//! Where a merge's functions are in the source, by frame name, for the
//! answers that name frames (flame graph, top table): the file a function's
//! profile or debug info records and the line it starts at, or, where only
//! lines are known (a symbolized frame: DWARF gives each address its line,
//! not the function's first), the first of its lines the samples hit.

use std::collections::BTreeMap;

use hashbrown::HashMap;
use kiln_contract::query_json::FrameSource;

use super::merged::MergedProfile;

impl MergedProfile {
    /// The source of each frame name in `names` whose function names a
    /// file. A name several files define (static functions of one name)
    /// gets the first file in sort order, so an answer is the same on
    /// every replica.
    pub fn frame_sources<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> BTreeMap<String, FrameSource> {
        let symbols = &self.symbols;
        let mut wanted: HashMap<&str, Option<(&str, u32)>> =
            names.into_iter().map(|n| (n, None)).collect();
        if wanted.is_empty() {
            return BTreeMap::new();
        }
        for location in &symbols.locations {
            for line in symbols.location_lines(location) {
                let Some(function) = symbols.function(line.function) else {
                    continue;
                };
                let file = symbols.string(function.filename);
                if file.is_empty() {
                    continue;
                }
                // The name frame_names gives this line.
                let mut name = symbols.string(function.name);
                if name.is_empty() {
                    name = symbols.string(function.system_name);
                }
                let Some(slot) = wanted.get_mut(name) else {
                    continue;
                };
                let at = if function.start_line > 0 {
                    function.start_line
                } else {
                    line.line
                };
                let at = u32::try_from(at).unwrap_or(0);
                *slot = Some(match *slot {
                    None => (file, at),
                    Some((known, _)) if file < known => (file, at),
                    Some((known, known_at)) if file == known => {
                        let first = match (known_at, at) {
                            (0, at) | (at, 0) => at,
                            (a, b) => a.min(b),
                        };
                        (known, first)
                    }
                    Some(kept) => kept,
                });
            }
        }
        wanted
            .into_iter()
            .filter_map(|(name, found)| {
                let (file, line) = found?;
                Some((
                    name.to_owned(),
                    FrameSource {
                        file: file.to_owned(),
                        line,
                    },
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{Function, Line, ROOT_NODE};

    /// A merge of one stack whose frames are `(name, file, start line,
    /// line)`, leaf first.
    fn merge(frames: &[(&str, &str, i64, i64)]) -> MergedProfile {
        let mut merged = MergedProfile::new();
        let mut parent = ROOT_NODE;
        for (i, &(name, file, start_line, line)) in frames.iter().enumerate() {
            let name = merged.symbols.intern_string(name);
            let filename = merged.symbols.intern_string(file);
            let function = merged.symbols.intern_function(Function {
                name,
                system_name: name,
                filename,
                start_line,
            });
            let location = merged.symbols.intern_location(
                crate::symbols::NO_MAPPING,
                0x1000 + i as u64,
                &[Line { function, line }],
            );
            parent = merged.symbols.intern_node(parent, location);
        }
        merged.values.insert((parent, 0), 1);
        merged.total = 1;
        merged
    }

    #[test]
    fn a_start_line_wins_else_the_first_line_sampled() {
        let merged = merge(&[
            ("hot", "hot.c", 0, 7),
            ("hot", "hot.c", 0, 5),
            ("main", "main.go", 40, 42),
            ("nofile", "", 3, 3),
        ]);
        let sources = merged.frame_sources(["hot", "main", "nofile", "absent"]);
        let shown: Vec<(String, String)> = sources
            .iter()
            .map(|(name, source)| (name.clone(), source.to_string()))
            .collect();
        assert_eq!(
            shown,
            [
                ("hot".to_owned(), "hot.c:5".to_owned()),
                ("main".to_owned(), "main.go:40".to_owned()),
            ]
        );
    }

    #[test]
    fn one_name_in_two_files_gets_the_first_file_and_an_unknown_line_shows_the_file() {
        let merged = merge(&[("init", "b.c", 0, 9), ("init", "a.c", 0, 0)]);
        let sources = merged.frame_sources(["init"]);
        assert_eq!(sources["init"].to_string(), "a.c");
    }
}
