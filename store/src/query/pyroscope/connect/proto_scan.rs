//! Counts the repeated fields of a querier request on the wire before
//! prost decodes it.
//!
//! prost turns each occurrence of a repeated field into an element, so two
//! bytes on the wire (`0a 00`, an empty string) become a 24-byte `String`
//! plus its share of the vector's growth: a small body could decode to
//! ten times its size and more. Here every repeated field a request
//! message has is counted against its cap, and singular message fields are
//! walked into, before anything is allocated; fields the message does not
//! have are skipped, as prost skips them without keeping them.

use kiln_pprof::protobuf_fields::{WireValue, fields};

use crate::error::ApiError;

/// What the scan knows of one message: its fields that can grow when
/// decoded. Other fields are skipped.
#[derive(Debug)]
pub struct Shape {
    /// The message's protobuf name, for errors.
    pub message: &'static str,
    /// The fields to count or walk into.
    pub fields: &'static [Field],
}

/// One field of a [`Shape`].
#[derive(Debug)]
pub struct Field {
    /// The field number.
    pub number: u64,
    /// The field's JSON name, for errors.
    pub name: &'static str,
    /// How it is checked.
    pub rule: Rule,
}

/// How a field is checked.
#[derive(Debug)]
pub enum Rule {
    /// A repeated field of at most `max` entries.
    Repeated {
        /// The cap.
        max: usize,
    },
    /// A singular message field, walked into. Given more than once it is
    /// refused: prost would merge the occurrences, adding up their
    /// repeated fields past any cap counted per occurrence.
    Message(&'static Shape),
    /// A field Kiln does not honour: present at all, the request is
    /// refused (as the JSON codec refuses it), since answering without it
    /// would answer another question than the one asked.
    NotHonoured {
        /// What asking for it means, for the error.
        asks_for: &'static str,
    },
}

/// Refuses `bytes` when a repeated field of `shape` passes its cap, or when
/// the wire format is broken.
pub fn check(bytes: &[u8], shape: &'static Shape) -> Result<(), ApiError> {
    let mut counts = vec![0usize; shape.fields.len()];
    let mut walked = fields(bytes);
    for (number, value) in walked.by_ref() {
        let Some(index) = shape.fields.iter().position(|f| f.number == number) else {
            continue;
        };
        let field = &shape.fields[index];
        counts[index] += 1;
        match &field.rule {
            Rule::Repeated { max } => {
                if counts[index] > *max {
                    return Err(ApiError::BadMessage {
                        message_type: shape.message,
                        message: format!("`{}` holds more than {max} entries", field.name),
                    });
                }
            }
            Rule::Message(inner) => {
                if counts[index] > 1 {
                    return Err(ApiError::BadMessage {
                        message_type: shape.message,
                        message: format!("`{}` is given more than once", field.name),
                    });
                }
                let WireValue::Bytes(payload) = value else {
                    return Err(broken(shape, "a message field is not length-delimited"));
                };
                check(payload, inner)?;
            }
            Rule::NotHonoured { asks_for } => {
                return Err(ApiError::BadMessage {
                    message_type: shape.message,
                    message: format!(
                        "`{}` is not supported by Kiln: it asks for {asks_for}",
                        field.name
                    ),
                });
            }
        }
    }
    // The walk stops early only at a truncated or malformed field, or at a
    // group, which no querier message has.
    if !walked.rest().is_empty() {
        return Err(broken(
            shape,
            "a field is truncated, malformed or of a wire type no querier message uses",
        ));
    }
    Ok(())
}

fn broken(shape: &Shape, what: &str) -> ApiError {
    ApiError::BadMessage {
        message_type: shape.message,
        message: what.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static INNER: Shape = Shape {
        message: "inner",
        fields: &[Field {
            number: 1,
            name: "callSite",
            rule: Rule::Repeated { max: 2 },
        }],
    };
    static OUTER: Shape = Shape {
        message: "outer",
        fields: &[
            Field {
                number: 1,
                name: "matchers",
                rule: Rule::Repeated { max: 3 },
            },
            Field {
                number: 7,
                name: "selector",
                rule: Rule::Message(&INNER),
            },
        ],
    };

    #[test]
    fn repeated_fields_are_counted_against_their_caps() {
        // matchers ×3, an int64 (field 3), a fixed64 (field 4), a string
        // of another field (2).
        let mut body = b"\x0a\x00\x0a\x01x\x0a\x00".to_vec();
        body.extend(b"\x18\x96\x01\x21\x00\x00\x00\x00\x00\x00\x00\x00\x12\x02ab");
        check(&body, &OUTER).unwrap();
        body.extend(b"\x0a\x00");
        let err = check(&body, &OUTER).unwrap_err();
        assert!(
            err.to_string().contains("`matchers` holds more than 3"),
            "{err}"
        );
    }

    #[test]
    fn message_fields_are_walked_into_and_given_once() {
        check(b"\x3a\x04\x0a\x00\x0a\x00", &OUTER).unwrap();
        let err = check(b"\x3a\x06\x0a\x00\x0a\x00\x0a\x00", &OUTER).unwrap_err();
        assert!(err.to_string().contains("`callSite`"), "{err}");
        let err = check(b"\x3a\x02\x0a\x00\x3a\x02\x0a\x00", &OUTER).unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
        assert!(
            check(b"\x38\x01", &OUTER).is_err(),
            "a varint where a message goes"
        );
    }

    #[test]
    fn a_broken_wire_format_is_refused() {
        for body in [
            &b"\x0a\x05ab"[..],
            b"\x80",
            b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            b"\x0b",
            b"\x21\x00",
            b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
        ] {
            assert!(check(body, &OUTER).is_err(), "{body:?}");
        }
        check(b"", &OUTER).unwrap();
    }
}
