//! The field values of Connect JSON requests, each read by a visitor that
//! keeps only what the field is: a scalar, or a list of strings refused as
//! soon as it passes its cap. A value of the wrong form is refused before
//! anything in it is kept, and the error names the field.

use std::fmt;

use kiln_api::types::v1 as t;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::super::MAX_CALL_SITES;

/// A JSON scalar, as read for one field.
enum Scalar {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Bool,
}

/// Reads the scalar value of `field`; a list or object there is refused as
/// not `expected`, before anything in it is kept.
#[derive(Clone, Copy)]
struct ScalarSeed {
    field: &'static str,
    expected: &'static str,
}

impl ScalarSeed {
    fn wrong<E: de::Error>(&self) -> E {
        E::custom(format_args!("`{}` must be {}", self.field, self.expected))
    }
}

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Scalar, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` as {}", self.field, self.expected)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        // Past i64 it is past every range these fields take, and the range
        // checks refuse it.
        Ok(Scalar::Int(i64::try_from(v).unwrap_or(i64::MAX)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
        Err(self.wrong())
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
        Err(self.wrong())
    }
}

/// The next value of `map`, an int64 field: a JSON number (saturating, as
/// JavaScript clients send large int64s as floats) or a decimal string.
pub(super) fn int64<'de, A: MapAccess<'de>>(
    map: &mut A,
    field: &'static str,
) -> Result<Option<i64>, A::Error> {
    let seed = ScalarSeed {
        field,
        expected: "an integer",
    };
    match map.next_value_seed(seed)? {
        Scalar::Null => Ok(None),
        Scalar::Int(n) => Ok(Some(n)),
        Scalar::Float(f) => Ok(Some(f as i64)),
        Scalar::Text(text) => text.trim().parse().map(Some).map_err(|_| seed.wrong()),
        Scalar::Bool => Err(seed.wrong()),
    }
}

/// A double field: a JSON number or a decimal string; unset is 0.
pub(super) fn double<'de, A: MapAccess<'de>>(
    map: &mut A,
    field: &'static str,
) -> Result<f64, A::Error> {
    let seed = ScalarSeed {
        field,
        expected: "a number",
    };
    match map.next_value_seed(seed)? {
        Scalar::Null => Ok(0.0),
        Scalar::Int(n) => Ok(n as f64),
        Scalar::Float(f) => Ok(f),
        Scalar::Text(text) => text.trim().parse().map_err(|_| seed.wrong()),
        Scalar::Bool => Err(seed.wrong()),
    }
}

/// A string field; unset is empty.
pub(super) fn string<'de, A: MapAccess<'de>>(
    map: &mut A,
    field: &'static str,
) -> Result<String, A::Error> {
    let seed = ScalarSeed {
        field,
        expected: "a string",
    };
    match map.next_value_seed(seed)? {
        Scalar::Null => Ok(String::new()),
        Scalar::Text(text) => Ok(text),
        _ => Err(seed.wrong()),
    }
}

/// An enum field, by name (from `variants`) or by number.
pub(super) fn enumeration<'de, A: MapAccess<'de>>(
    map: &mut A,
    field: &'static str,
    variants: &[(&str, i32)],
) -> Result<Option<i32>, A::Error> {
    let seed = ScalarSeed {
        field,
        expected: "an enum name",
    };
    match map.next_value_seed(seed)? {
        Scalar::Null => Ok(None),
        Scalar::Int(n) => i32::try_from(n)
            .map(Some)
            .map_err(|_| de::Error::custom(format_args!("`{field}` is not a valid enum number"))),
        Scalar::Text(text) => variants
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, number)| Some(*number))
            .ok_or_else(|| {
                let shown: String = text.chars().take(64).collect();
                de::Error::custom(format_args!("`{field}` has unknown value {shown:?}"))
            }),
        Scalar::Float(_) | Scalar::Bool => Err(seed.wrong()),
    }
}

/// A list of strings of at most `max` entries, refused as soon as it
/// passes it; unset is empty.
pub(super) struct StringList {
    pub(super) field: &'static str,
    pub(super) max: usize,
}

impl StringList {
    pub(super) fn read<'de, A: MapAccess<'de>>(self, map: &mut A) -> Result<Vec<String>, A::Error> {
        map.next_value_seed(self)
    }
}

impl<'de> DeserializeSeed<'de> for StringList {
    type Value = Vec<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Self::Value, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringList {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` as a list of strings", self.field)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let element = || ScalarSeed {
            field: self.field,
            expected: "a list of strings",
        };
        // The size hint is the client's to choose: never reserve from it.
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(element())? {
            let Scalar::Text(text) = item else {
                return Err(element().wrong());
            };
            if out.len() == self.max {
                return Err(de::Error::custom(format_args!(
                    "`{}` holds more than {} entries",
                    self.field, self.max
                )));
            }
            out.push(text);
        }
        Ok(out)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(self.not_a_list())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(self.not_a_list())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(self.not_a_list())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(self.not_a_list())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(self.not_a_list())
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.not_a_list())
    }
}

impl StringList {
    fn not_a_list<E: de::Error>(&self) -> E {
        E::custom(format_args!("`{}` must be a list", self.field))
    }
}

/// A stack trace selector: only whether one with content is present is
/// kept (Kiln refuses those); its content is skipped, never stored. The
/// call sites it may list are capped as protobuf's are.
pub(super) struct StackTraceSelector;

impl<'de> DeserializeSeed<'de> for StackTraceSelector {
    type Value = Option<t::StackTraceSelector>;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Self::Value, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StackTraceSelector {
    type Value = Option<t::StackTraceSelector>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`stackTraceSelector` as an object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut present = false;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value::<IgnoredAny>()?;
            present = true;
        }
        // A marker call site: what is set does not matter, only that it is.
        Ok(present.then(|| t::StackTraceSelector {
            call_site: vec![t::Location {
                name: "(set)".to_owned(),
            }],
            go_pgo: None,
        }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut entries = 0usize;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            entries += 1;
            if entries > MAX_CALL_SITES {
                return Err(de::Error::custom("`stackTraceSelector` is too long"));
            }
        }
        Ok(None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
}
