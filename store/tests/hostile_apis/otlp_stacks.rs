//! OTLP profiles keep stacks in a dictionary that samples point into: one
//! stack of 8M location indices (8 MiB on the wire, 10 KB gzipped) shared
//! by 200 samples of 3 bytes each. Copied once per sample, it is 200 ×
//! 32 MiB; the stack's length must be refused before anything is copied.

use kiln_api::kiln::otlp::v1_8;
use kiln_testkit::wire::gzip;
use prost::Message;

use super::{Attack, Expect, Hostile};

/// Location indices in the one stack (all 0, one byte each when packed).
const STACK_LENGTH: usize = 8 << 20;
/// Samples that point at it.
const SAMPLES: usize = 200;

/// An OTLP 1.8 export: dictionary `string_table: [""]`, one empty
/// location, one stack of [`STACK_LENGTH`] zeros, one profile of
/// [`SAMPLES`] samples `{values: [1]}` on stack 0.
fn export_request() -> Vec<u8> {
    v1_8::ExportRequest {
        dictionary: Some(v1_8::ProfilesDictionary {
            string_table: vec![String::new()],
            location_table: vec![v1_8::Location::default()],
            stack_table: vec![v1_8::Stack {
                location_indices: vec![0; STACK_LENGTH],
            }],
            ..Default::default()
        }),
        resource_profiles: vec![v1_8::ResourceProfiles {
            scope_profiles: vec![v1_8::ScopeProfiles {
                profiles: vec![v1_8::Profile {
                    sample: vec![
                        v1_8::Sample {
                            values: vec![1],
                            ..Default::default()
                        };
                        SAMPLES
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn export(name: &'static str, gzipped: bool) {
    let Some(attack) = Attack::start(name) else {
        return;
    };
    let plain = export_request();
    let body = if gzipped { gzip(&plain) } else { plain };
    let mut headers = vec![("Content-Type", "application/x-protobuf")];
    if gzipped {
        headers.push(("Content-Encoding", "gzip"));
    }
    attack.run(|addr| {
        vec![Hostile::http(
            format!(
                "OTLP 1.8 export, one stack of {STACK_LENGTH} indices under {SAMPLES} samples ({} bytes{})",
                body.len(),
                if gzipped { " gzipped" } else { "" }
            ),
            Expect::Refused,
            addr,
            "POST",
            "/v1development/profiles",
            &headers,
            &body,
        )]
    });
}

#[test]
fn otlp_stack_of_8m_indices_shared_by_200_samples() {
    export("otlp_stack_of_8m_indices_x200_samples", false);
}

#[test]
fn otlp_stack_of_8m_indices_shared_by_200_samples_gzipped() {
    export("otlp_stack_of_8m_indices_x200_gzipped", true);
}
