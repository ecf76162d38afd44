//! Profile ids: how a SelectSeries exemplar names one profile, and how a
//! `profile_id_selector` finds it again.
//!
//! Kiln keeps no table of ids. An id is a UUID in version 7's layout whose
//! 48-bit time is the profile's unix ms and whose 74 free bits carry a
//! 64-bit fingerprint of its series' labels (the 10 left over are zero, so
//! an id Kiln did not issue is told apart). Finding the profile again is a
//! series lookup at that millisecond: the series whose labels hash to the
//! fingerprint, merged over `[time_ms, time_ms + 1)`. Ids stay valid across
//! restarts, replicas and compaction, since labels and times do.

use kiln_engine::model::{LabelSet, MatchOp, Matcher, PROFILE_TYPE_LABEL, Selector, TimeRange};

/// The largest time a version 7 UUID holds: 48 bits of ms.
const MAX_TIME_MS: i64 = (1 << 48) - 1;
/// The fingerprint bits that go in `rand_a`, above the 52 in `rand_b`.
const LOW_FINGERPRINT_BITS: u32 = 52;
/// `rand_b`'s low bits that Kiln leaves zero.
const SPARE_BITS: u32 = 10;

/// Why text is not a profile id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileIdError {
    /// Not a UUID in its 8-4-4-4-12 hex form.
    #[error("{text:?} is not a UUID (8-4-4-4-12 hex digits)")]
    NotAUuid {
        /// The text (its first 64 characters).
        text: String,
    },
    /// A UUID, but not one that Kiln issued as a profile id.
    #[error(
        "{text:?} is not a profile id that Kiln issued (they come from SelectSeries exemplars)"
    )]
    NotIssuedByKiln {
        /// The UUID.
        text: String,
    },
}

/// One profile: a series at one millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileId {
    /// When the profile was taken, unix ms.
    pub time_ms: i64,
    /// [`series_fingerprint`] of its series' labels.
    pub series: u64,
}

impl ProfileId {
    /// The id of the profile of `labels` at `time_ms`; `None` for a time
    /// before 1970 or past the year 10889, which an id cannot hold.
    pub fn of(time_ms: i64, labels: &LabelSet) -> Option<Self> {
        (0..=MAX_TIME_MS).contains(&time_ms).then(|| Self {
            time_ms,
            series: series_fingerprint(labels),
        })
    }

    /// The id as a lowercase hyphenated UUID.
    pub fn to_uuid(self) -> String {
        let low_mask = (1u64 << LOW_FINGERPRINT_BITS) - 1;
        // In range by construction (`of`), so the cast keeps every bit.
        let bits: u128 = ((self.time_ms as u128) << 80)
            | (0x7 << 76)
            | (u128::from(self.series >> LOW_FINGERPRINT_BITS) << 64)
            | (0b10 << 62)
            | (u128::from(self.series & low_mask) << SPARE_BITS);
        let hex = format!("{bits:032x}");
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// Reads an id that [`ProfileId::to_uuid`] wrote (any case).
    pub fn parse(text: &str) -> Result<Self, ProfileIdError> {
        let shown = || text.chars().take(64).collect::<String>();
        let bytes = text.as_bytes();
        let hyphens_in_place = bytes.len() == 36
            && [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-')
            && bytes
                .iter()
                .enumerate()
                .all(|(i, b)| [8, 13, 18, 23].contains(&i) || b.is_ascii_hexdigit());
        if !hyphens_in_place {
            return Err(ProfileIdError::NotAUuid { text: shown() });
        }
        let digits: String = text.chars().filter(|c| *c != '-').collect();
        let bits = u128::from_str_radix(&digits, 16)
            .map_err(|_| ProfileIdError::NotAUuid { text: shown() })?;
        let version = (bits >> 76) & 0xf;
        let variant = (bits >> 62) & 0b11;
        let spare = bits & ((1 << SPARE_BITS) - 1);
        if version != 7 || variant != 0b10 || spare != 0 {
            return Err(ProfileIdError::NotIssuedByKiln { text: shown() });
        }
        let low_mask = (1u128 << LOW_FINGERPRINT_BITS) - 1;
        let high = (bits >> 64) & 0xfff;
        let low = (bits >> SPARE_BITS) & low_mask;
        Ok(Self {
            // 48 bits: always fits.
            time_ms: (bits >> 80) as i64,
            series: ((high << LOW_FINGERPRINT_BITS) | low) as u64,
        })
    }

    /// The millisecond the profile was taken in.
    pub fn range(self) -> TimeRange {
        TimeRange {
            start_ms: self.time_ms,
            end_ms: self.time_ms.saturating_add(1),
        }
    }
}

/// A fingerprint of a series' labels that does not change between
/// processes or versions: FNV-1a over each name and value, each followed
/// by a 0xff byte (which UTF-8 never holds, so no two label sets run
/// together the same way).
pub fn series_fingerprint(labels: &LabelSet) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes.iter().chain(&[0xff]) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for label in labels.iter() {
        feed(label.name.as_bytes());
        feed(label.value.as_bytes());
    }
    hash
}

/// `selector` narrowed to exactly the series `target`, out of `candidates`
/// (the series the selection has in the profile's millisecond): each of its
/// labels by value, and each label that only other candidates carry as
/// absent, so a series with more labels is not selected with it.
pub fn exact_selector(selector: &Selector, target: &LabelSet, candidates: &[LabelSet]) -> Selector {
    let mut exact = selector.clone();
    exact.matchers.extend(
        target
            .iter()
            .filter(|l| l.name != PROFILE_TYPE_LABEL)
            .map(|l| Matcher {
                name: l.name.clone(),
                op: MatchOp::Equal,
                value: l.value.clone(),
            }),
    );
    let mut absent: Vec<&str> = candidates
        .iter()
        .flat_map(|c| c.iter().map(|l| l.name.as_str()))
        .filter(|name| target.get(name).is_none())
        .collect();
    absent.sort_unstable();
    absent.dedup();
    exact
        .matchers
        .extend(absent.into_iter().map(|name| Matcher {
            name: name.to_owned(),
            op: MatchOp::Equal,
            value: String::new(),
        }));
    exact
}

#[cfg(test)]
mod tests {
    use kiln_engine::model::{Label, ProfileType};

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelSet {
        LabelSet::new(pairs.iter().map(|(n, v)| Label::new(*n, *v)).collect())
    }

    #[test]
    fn an_id_reads_back_as_the_profile_it_names() {
        let series = labels(&[("service_name", "checkout"), ("env", "prod")]);
        for time_ms in [0, 1, 1_700_000_000_123, MAX_TIME_MS] {
            let id = ProfileId::of(time_ms, &series).expect("in range");
            let text = id.to_uuid();
            assert_eq!(text.len(), 36, "{text}");
            assert_eq!(&text[14..15], "7", "version 7: {text}");
            assert!("89ab".contains(&text[19..20]), "RFC variant: {text}");
            assert_eq!(ProfileId::parse(&text), Ok(id));
            assert_eq!(ProfileId::parse(&text.to_uppercase()), Ok(id));
        }
        assert_eq!(ProfileId::of(-1, &series), None);
        assert_eq!(ProfileId::of(MAX_TIME_MS + 1, &series), None);
    }

    #[test]
    fn fingerprints_tell_series_apart_and_do_not_change() {
        let a = labels(&[("a", "bc")]);
        let b = labels(&[("ab", "c")]);
        assert_ne!(series_fingerprint(&a), series_fingerprint(&b));
        assert_ne!(
            series_fingerprint(&labels(&[("env", "prod")])),
            series_fingerprint(&labels(&[("env", "dev")]))
        );
        // Fixed forever: ids handed out before an upgrade must still resolve.
        assert_eq!(
            series_fingerprint(&LabelSet::new(vec![])),
            0xcbf2_9ce4_8422_2325
        );
        assert_eq!(
            series_fingerprint(&a),
            series_fingerprint(&labels(&[("a", "bc")]))
        );
    }

    #[test]
    fn other_text_is_refused_with_the_reason() {
        for text in [
            "",
            "not-a-uuid",
            "7c9e6679742540de944be07fc1f90ae7",
            "7c9e6679-7425-40de-944b-e07fc1f90ae7x",
            "7c9e6679-7425-40de-944b+e07fc1f90ae7",
            "7c9e6679-7425-40de-944b-e07fc1f90aeg",
        ] {
            assert!(
                matches!(ProfileId::parse(text), Err(ProfileIdError::NotAUuid { .. })),
                "{text}"
            );
        }
        // A random (version 4) UUID, and a version 7 one with its spare
        // bits set: UUIDs, but not Kiln's.
        for text in [
            "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "018c2b5e-3f00-7000-8000-0000000003ff",
        ] {
            assert!(
                matches!(
                    ProfileId::parse(text),
                    Err(ProfileIdError::NotIssuedByKiln { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn the_exact_selector_leaves_out_series_with_more_labels() {
        let selector = Selector {
            profile_type: ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
                .expect("a profile type"),
            matchers: vec![],
        };
        let target = labels(&[("service_name", "a"), (PROFILE_TYPE_LABEL, "x")]);
        let wider = labels(&[
            ("service_name", "a"),
            ("pod", "p"),
            (PROFILE_TYPE_LABEL, "x"),
        ]);
        let exact = exact_selector(&selector, &target, &[target.clone(), wider.clone()]);
        let compiled: Vec<_> = exact
            .matchers
            .iter()
            .map(|m| (m.name.as_str(), m.value.as_str()))
            .collect();
        assert_eq!(compiled, vec![("service_name", "a"), ("pod", "")]);
    }
}
