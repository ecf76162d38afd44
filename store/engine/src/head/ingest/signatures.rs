//! Phase 2 of ingest: samples grouped by the string labels they promote
//! to series labels (their "signature"), and the (signature, profile type)
//! slots that receive a non-zero value.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

/// The samples of one profile by signature.
pub(super) struct Signatures {
    /// Per string-table entry: whether a label with that key stays per sample.
    pub(super) per_sample_keys: Vec<bool>,
    /// Each signature's promoted (key, value) string indices, sorted;
    /// signature 0 promotes nothing.
    pub(super) keys: Vec<Vec<(i64, i64)>>,
    /// The signature of each sample.
    pub(super) sample_signature: Vec<u32>,
    /// Per (signature, profile type) slot, `signature * types + type`:
    /// whether any sample puts a non-zero value there.
    pub(super) slot_used: Vec<bool>,
}

impl Signatures {
    /// Groups the samples of `profile`, which has `type_count` sample types.
    pub(super) fn group(profile: &impl ProfileView, type_count: usize) -> Self {
        let samples = profile.sample_count();
        let mut signatures: HashMap<Vec<(i64, i64)>, u32> = HashMap::new();
        let mut signature_keys: Vec<Vec<(i64, i64)>> = vec![Vec::new()];
        signatures.insert(Vec::new(), 0);
        let mut sample_signature: Vec<u32> = Vec::with_capacity(samples);
        let mut slot_used: Vec<bool> = vec![false; type_count];
        let mut scratch: Vec<(i64, i64)> = Vec::new();
        let per_sample_keys: Vec<bool> = (0..profile.string_count())
            // Ids with a value per request, process or thread would make a
            // series each, and one busy client would spend everyone's
            // series limits.
            .map(|i| kiln_contract::sample_labels::stays_per_sample(profile.string(i as i64)))
            .collect();
        for index in 0..samples {
            let sample = profile.sample(index);
            scratch.clear();
            for label in sample.labels {
                if is_promoted(&per_sample_keys, label.key, label.str) {
                    scratch.push((label.key, label.str));
                }
            }
            let signature = if scratch.is_empty() {
                0
            } else {
                scratch.sort_unstable();
                match signatures.get(scratch.as_slice()) {
                    Some(&s) => s,
                    None => {
                        let s = signature_keys.len() as u32;
                        signatures.insert(scratch.clone(), s);
                        signature_keys.push(scratch.clone());
                        slot_used.extend(std::iter::repeat_n(false, type_count));
                        s
                    }
                }
            };
            sample_signature.push(signature);
            let base = signature as usize * type_count;
            for (t, &value) in sample.values.iter().enumerate() {
                if value != 0 {
                    slot_used[base + t] = true;
                }
            }
        }
        Self {
            per_sample_keys,
            keys: signature_keys,
            sample_signature,
            slot_used,
        }
    }
}

/// Whether a sample label (`key`, string value `str_index`) is promoted to
/// a series label: a string value whose key does not stay per sample.
pub(super) fn is_promoted(per_sample_keys: &[bool], key: i64, str_index: i64) -> bool {
    str_index != 0
        && !usize::try_from(key)
            .ok()
            .and_then(|k| per_sample_keys.get(k))
            .copied()
            .unwrap_or(false)
}
