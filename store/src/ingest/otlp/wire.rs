//! What an export request would allocate under each revision's layout,
//! counted on the wire before prost decodes it ([`message_scan`]).
//!
//! A packed stack of eight million zero indices is 8 MiB on the wire and
//! 32 MiB decoded, and each sample referring to it was once copied: a
//! 10 KB gzipped body asked for gigabytes. So each dictionary table, each
//! stack's locations, each location's lines and each profile's samples are
//! counted and refused past their limits here, and the rest estimated for
//! the caller to reserve, all before anything is decoded.

use std::mem::size_of;

use kiln_api::kiln::otlp::{v1_7, v1_8, v1_9, v1_10};
use kiln_api::opentelemetry::proto::common::v1 as common;
use kiln_api::opentelemetry::proto::resource::v1 as resource;

use super::{OtlpError, OtlpLimits, Revision};
use crate::ingest::message_scan::{self, Cap, Field, Kind, Limit, OverLimit, Shape};

/// Walks `request` as `revision` lays it out; returns the estimated bytes
/// its decoded request takes, or why it is refused.
pub(super) fn scan(
    request: &[u8],
    revision: Revision,
    limits: &OtlpLimits,
) -> Result<usize, OtlpError> {
    let shape = match revision {
        Revision::V1_7 => &V1_7_REQUEST,
        Revision::V1_8 => &V1_8_REQUEST,
        Revision::V1_9 => &V1_9_REQUEST,
        Revision::V1_10 => &V1_10_REQUEST,
    };
    let limits = message_scan::Limits {
        series: 0,
        profiles: 0,
        samples: limits.max_samples,
        stack_depth: limits.max_stack_depth,
        table_entries: limits.max_table_entries,
    };
    message_scan::scan(request, shape, &limits)
        .map(|scan| scan.decoded_bytes)
        .map_err(otlp_error)
}

fn otlp_error(over: OverLimit) -> OtlpError {
    match over.limit_kind {
        Limit::TableEntries => OtlpError::TableTooLarge {
            table: over.what,
            count: over.count,
            limit: over.limit,
        },
        Limit::StackDepth => OtlpError::StackTooDeep {
            field: over.what,
            count: over.count,
            limit: over.limit,
        },
        _ => OtlpError::TooMany {
            what: over.what,
            count: over.count,
            limit: over.limit,
        },
    }
}

/// A field without a limit.
const fn plain(number: u32, kind: Kind) -> Field {
    Field {
        number,
        kind,
        cap: None,
    }
}

/// A field whose entries in one message are limited.
const fn capped(number: u32, kind: Kind, what: &'static str, limit: Limit) -> Field {
    Field {
        number,
        kind,
        cap: Some(Cap {
            what,
            limit,
            per_request: false,
        }),
    }
}

/// A dictionary table: entries limited per dictionary.
const fn table(number: u32, kind: Kind, what: &'static str) -> Field {
    capped(number, kind, what, Limit::TableEntries)
}

const I32: Kind = Kind::Scalars(4);
const I64: Kind = Kind::Scalars(8);

// Attribute values nest (arrays and lists of values): the shapes refer to
// each other, as the messages do.
static ANY_VALUE: Shape = Shape {
    struct_bytes: size_of::<common::AnyValue>(),
    fields: &[
        plain(1, Kind::Bytes),
        plain(5, Kind::Message(&ARRAY_VALUE)),
        plain(6, Kind::Message(&KEY_VALUE_LIST)),
        plain(7, Kind::Bytes),
    ],
};
static ARRAY_VALUE: Shape = Shape {
    struct_bytes: size_of::<common::ArrayValue>(),
    fields: &[plain(1, Kind::Message(&ANY_VALUE))],
};
static KEY_VALUE_LIST: Shape = Shape {
    struct_bytes: size_of::<common::KeyValueList>(),
    fields: &[plain(1, Kind::Message(&KEY_VALUE))],
};
static KEY_VALUE: Shape = Shape {
    struct_bytes: size_of::<common::KeyValue>(),
    fields: &[plain(1, Kind::Bytes), plain(2, Kind::Message(&ANY_VALUE))],
};
static RESOURCE: Shape = Shape {
    struct_bytes: size_of::<resource::Resource>(),
    fields: &[plain(1, Kind::Message(&KEY_VALUE))],
};
static SCOPE: Shape = Shape {
    struct_bytes: size_of::<common::InstrumentationScope>(),
    fields: &[
        plain(1, Kind::Bytes),
        plain(2, Kind::Bytes),
        plain(3, Kind::Message(&KEY_VALUE)),
    ],
};
static VALUE_TYPE: Shape = Shape {
    struct_bytes: size_of::<v1_8::ValueType>(),
    fields: &[],
};
static LINE: Shape = Shape {
    struct_bytes: size_of::<v1_8::Line>(),
    fields: &[],
};
static FUNCTION: Shape = Shape {
    struct_bytes: size_of::<v1_8::Function>(),
    fields: &[],
};
static LINK: Shape = Shape {
    struct_bytes: size_of::<v1_8::Link>(),
    fields: &[plain(1, Kind::Bytes), plain(2, Kind::Bytes)],
};

// 1.8, 1.9 and 1.10 share the dictionary.
static V1_8_MAPPING: Shape = Shape {
    struct_bytes: size_of::<v1_8::Mapping>(),
    fields: &[plain(5, I32)],
};
static V1_8_LOCATION: Shape = Shape {
    struct_bytes: size_of::<v1_8::Location>(),
    fields: &[
        // Inlined lines unwind into frames: they share the stack limit.
        capped(
            3,
            Kind::Message(&LINE),
            "lines in one location",
            Limit::StackDepth,
        ),
        plain(4, I32),
    ],
};
static V1_8_STACK: Shape = Shape {
    struct_bytes: size_of::<v1_8::Stack>(),
    fields: &[capped(1, I32, "stack.location_indices", Limit::StackDepth)],
};
static V1_8_ATTRIBUTE: Shape = Shape {
    struct_bytes: size_of::<v1_8::KeyValueAndUnit>(),
    fields: &[plain(2, Kind::Message(&ANY_VALUE))],
};
static V1_8_DICTIONARY: Shape = Shape {
    struct_bytes: size_of::<v1_8::ProfilesDictionary>(),
    fields: &[
        table(1, Kind::Message(&V1_8_MAPPING), "mapping_table"),
        table(2, Kind::Message(&V1_8_LOCATION), "location_table"),
        table(3, Kind::Message(&FUNCTION), "function_table"),
        table(4, Kind::Message(&LINK), "link_table"),
        table(5, Kind::Bytes, "string_table"),
        table(6, Kind::Message(&V1_8_ATTRIBUTE), "attribute_table"),
        table(7, Kind::Message(&V1_8_STACK), "stack_table"),
    ],
};
static V1_8_SAMPLE: Shape = Shape {
    struct_bytes: size_of::<v1_8::Sample>(),
    fields: &[plain(2, I64), plain(3, I32), plain(5, I64)],
};
static V1_10_SAMPLE: Shape = Shape {
    struct_bytes: size_of::<v1_10::Sample>(),
    fields: &[plain(2, I32), plain(4, I64), plain(5, I64)],
};

/// The request, resource and scope messages around a revision's profile.
macro_rules! request_shapes {
    ($request:ident, $resource:ident, $scope:ident, $profile:ident, $layout:ident, $dictionary:ident) => {
        static $scope: Shape = Shape {
            struct_bytes: size_of::<$layout::ScopeProfiles>(),
            fields: &[
                plain(1, Kind::Message(&SCOPE)),
                plain(2, Kind::Message(&$profile)),
                plain(3, Kind::Bytes),
            ],
        };
        static $resource: Shape = Shape {
            struct_bytes: size_of::<$layout::ResourceProfiles>(),
            fields: &[
                plain(1, Kind::Message(&RESOURCE)),
                plain(2, Kind::Message(&$scope)),
                plain(3, Kind::Bytes),
            ],
        };
        static $request: Shape = Shape {
            struct_bytes: size_of::<$layout::ExportRequest>(),
            fields: &[
                plain(1, Kind::Message(&$resource)),
                plain(2, Kind::Message(&$dictionary)),
            ],
        };
    };
}

const SAMPLES: &str = "samples in one profile";

static V1_8_PROFILE: Shape = Shape {
    struct_bytes: size_of::<v1_8::Profile>(),
    fields: &[
        plain(1, Kind::Message(&VALUE_TYPE)),
        capped(2, Kind::Message(&V1_8_SAMPLE), SAMPLES, Limit::Samples),
        plain(5, Kind::Message(&VALUE_TYPE)),
        plain(7, I32),
        plain(8, Kind::Bytes),
        plain(10, Kind::Bytes),
        plain(11, Kind::Bytes),
        plain(12, I32),
    ],
};
request_shapes!(
    V1_8_REQUEST,
    V1_8_RESOURCE,
    V1_8_SCOPE,
    V1_8_PROFILE,
    v1_8,
    V1_8_DICTIONARY
);

static V1_9_PROFILE: Shape = Shape {
    struct_bytes: size_of::<v1_9::Profile>(),
    fields: &[
        plain(1, Kind::Message(&VALUE_TYPE)),
        capped(2, Kind::Message(&V1_8_SAMPLE), SAMPLES, Limit::Samples),
        plain(5, Kind::Message(&VALUE_TYPE)),
        plain(7, Kind::Bytes),
        plain(9, Kind::Bytes),
        plain(10, Kind::Bytes),
        plain(11, I32),
    ],
};
request_shapes!(
    V1_9_REQUEST,
    V1_9_RESOURCE,
    V1_9_SCOPE,
    V1_9_PROFILE,
    v1_9,
    V1_8_DICTIONARY
);

static V1_10_PROFILE: Shape = Shape {
    struct_bytes: size_of::<v1_10::Profile>(),
    fields: &[
        plain(1, Kind::Message(&VALUE_TYPE)),
        capped(2, Kind::Message(&V1_10_SAMPLE), SAMPLES, Limit::Samples),
        plain(5, Kind::Message(&VALUE_TYPE)),
        plain(7, Kind::Bytes),
        plain(9, Kind::Bytes),
        plain(10, Kind::Bytes),
        plain(11, I32),
    ],
};
request_shapes!(
    V1_10_REQUEST,
    V1_10_RESOURCE,
    V1_10_SCOPE,
    V1_10_PROFILE,
    v1_10,
    V1_8_DICTIONARY
);

// 1.7: its own dictionary, and samples that slice the profile's locations.
static V1_7_MAPPING: Shape = Shape {
    struct_bytes: size_of::<v1_7::Mapping>(),
    fields: &[plain(5, I32)],
};
static V1_7_LOCATION: Shape = Shape {
    struct_bytes: size_of::<v1_7::Location>(),
    fields: &[
        capped(
            3,
            Kind::Message(&LINE),
            "lines in one location",
            Limit::StackDepth,
        ),
        plain(5, I32),
    ],
};
static V1_7_ATTRIBUTE_UNIT: Shape = Shape {
    struct_bytes: size_of::<v1_7::AttributeUnit>(),
    fields: &[],
};
static V1_7_DICTIONARY: Shape = Shape {
    struct_bytes: size_of::<v1_7::ProfilesDictionary>(),
    fields: &[
        table(1, Kind::Message(&V1_7_MAPPING), "mapping_table"),
        table(2, Kind::Message(&V1_7_LOCATION), "location_table"),
        table(3, Kind::Message(&FUNCTION), "function_table"),
        table(4, Kind::Message(&LINK), "link_table"),
        table(5, Kind::Bytes, "string_table"),
        table(6, Kind::Message(&KEY_VALUE), "attribute_table"),
        table(7, Kind::Message(&V1_7_ATTRIBUTE_UNIT), "attribute_units"),
    ],
};
static V1_7_SAMPLE: Shape = Shape {
    struct_bytes: size_of::<v1_7::Sample>(),
    fields: &[plain(3, I64), plain(4, I32), plain(6, I64)],
};
static V1_7_PROFILE: Shape = Shape {
    struct_bytes: size_of::<v1_7::Profile>(),
    fields: &[
        plain(1, Kind::Message(&VALUE_TYPE)),
        capped(2, Kind::Message(&V1_7_SAMPLE), SAMPLES, Limit::Samples),
        plain(3, I32),
        plain(6, Kind::Message(&VALUE_TYPE)),
        plain(8, I32),
        plain(10, Kind::Bytes),
        plain(12, Kind::Bytes),
        plain(13, Kind::Bytes),
        plain(14, I32),
    ],
};
request_shapes!(
    V1_7_REQUEST,
    V1_7_RESOURCE,
    V1_7_SCOPE,
    V1_7_PROFILE,
    v1_7,
    V1_7_DICTIONARY
);

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tables: usize) -> OtlpLimits {
        OtlpLimits {
            max_table_entries: tables,
            max_samples: 3,
            max_stack_depth: 4,
        }
    }

    /// A request of one dictionary holding `dictionary`.
    fn with_dictionary(dictionary: &[u8]) -> Vec<u8> {
        let mut request = vec![0x12, dictionary.len() as u8];
        request.extend_from_slice(dictionary);
        request
    }

    #[test]
    fn counts_string_table_entries_in_the_dictionary() {
        // dictionary { string_table: "", "a", "b" }
        let request = with_dictionary(&[0x2a, 0x00, 0x2a, 0x01, b'a', 0x2a, 0x01, b'b']);
        for revision in Revision::ALL {
            assert!(scan(&request, revision, &limits(3)).is_ok());
            let err = scan(&request, revision, &limits(2)).unwrap_err();
            assert_eq!(
                err,
                OtlpError::TableTooLarge {
                    table: "string_table",
                    count: 3,
                    limit: 2
                }
            );
        }
    }

    #[test]
    fn a_deep_stack_is_refused_before_decoding_in_1_8_and_later() {
        // dictionary { stack_table: [{ location_indices: [0, 0, 0, 0, 0] }] }
        let request = with_dictionary(&[0x3a, 0x07, 0x0a, 0x05, 0, 0, 0, 0, 0]);
        for revision in [Revision::V1_8, Revision::V1_9, Revision::V1_10] {
            let err = scan(&request, revision, &limits(10)).unwrap_err();
            assert_eq!(err.reason(), "otlp_stack_too_deep", "{err}");
        }
    }

    #[test]
    fn samples_are_counted_per_profile() {
        // resource_profiles { scope_profiles { profiles { 4 empty samples } } }
        let profile = [0x12, 0x00].repeat(4);
        let mut scope = vec![0x12, profile.len() as u8];
        scope.extend_from_slice(&profile);
        let mut resource = vec![0x12, scope.len() as u8];
        resource.extend_from_slice(&scope);
        let mut request = vec![0x0a, resource.len() as u8];
        request.extend_from_slice(&resource);
        for revision in Revision::ALL {
            let err = scan(&request, revision, &limits(10)).unwrap_err();
            assert_eq!(
                err,
                OtlpError::TooMany {
                    what: SAMPLES,
                    count: 4,
                    limit: 3
                }
            );
        }
    }

    #[test]
    fn malformed_bytes_are_left_to_the_decoder() {
        for revision in Revision::ALL {
            assert!(scan(&[0x12, 0x7f], revision, &limits(1)).is_ok());
            assert!(scan(&[0xff], revision, &limits(1)).is_ok());
        }
    }
}
