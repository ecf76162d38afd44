//! The top table: flat and cumulative value per function.

use hashbrown::HashMap;

pub use kiln_contract::query_json::TopEntry;

use super::flamegraph::MAX_UNWOUND_FRAMES;
use super::merged::{MergedProfile, frame_names};

impl MergedProfile {
    /// The `limit` functions with the largest flat value (then cumulative),
    /// each with its source where known.
    pub fn top(&self, limit: usize) -> Vec<TopEntry> {
        let symbols = &self.symbols;
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut rows: Vec<TopEntry> = Vec::new();
        let mut seen_in_stack: Vec<u64> = Vec::new();
        // Row ids per location, resolved once: `(start, len)` into `row_ids`.
        let mut location_rows: Vec<Option<(usize, usize)>> = vec![None; symbols.location_count()];
        let mut row_ids: Vec<usize> = Vec::new();
        let mut locations = Vec::new();
        let mut names = Vec::new();
        for (generation, (&(stack, _), &value)) in self.values.iter().enumerate() {
            let generation = generation as u64 + 1;
            locations.clear();
            symbols.stack_locations(stack, &mut locations);
            // Leaf first, at most `MAX_UNWOUND_FRAMES` frames: a stack
            // stored before ingest capped unwound depth may have millions,
            // and only its root side is left out.
            let mut depth = 0usize;
            for &location in &locations {
                if depth >= MAX_UNWOUND_FRAMES {
                    break;
                }
                let Some(slot) = location_rows.get(location as usize) else {
                    continue;
                };
                let (start, len) = match *slot {
                    Some(range) => range,
                    None => {
                        names.clear();
                        if let Some(l) = symbols.location(location) {
                            frame_names(symbols, l, &mut names);
                        }
                        let start = row_ids.len();
                        for name in &names {
                            let id = match ids.get(name.as_str()) {
                                Some(&id) => id,
                                None => {
                                    let id = rows.len();
                                    rows.push(TopEntry {
                                        name: name.clone(),
                                        flat: 0,
                                        cumulative: 0,
                                        source: None,
                                    });
                                    seen_in_stack.push(0);
                                    ids.insert(name.clone(), id);
                                    id
                                }
                            };
                            row_ids.push(id);
                        }
                        location_rows[location as usize] = Some((start, names.len()));
                        (start, names.len())
                    }
                };
                let room = MAX_UNWOUND_FRAMES - depth;
                for &id in row_ids[start..start + len].iter().take(room) {
                    if depth == 0 {
                        rows[id].flat = rows[id].flat.wrapping_add(value);
                    }
                    // Recursion must not count a stack twice.
                    if seen_in_stack[id] != generation {
                        seen_in_stack[id] = generation;
                        rows[id].cumulative = rows[id].cumulative.wrapping_add(value);
                    }
                    depth += 1;
                }
            }
        }
        rows.sort_by(|a, b| {
            b.flat
                .cmp(&a.flat)
                .then(b.cumulative.cmp(&a.cumulative))
                .then(a.name.cmp(&b.name))
        });
        rows.truncate(limit);
        let mut sources = self.frame_sources(rows.iter().map(|r| r.name.as_str()));
        for row in &mut rows {
            row.source = sources.remove(&row.name);
        }
        rows
    }
}
