//! Push over Connect with JSON bodies (`application/json`), as in
//! Pyroscope's curl examples: protobuf JSON mapping, `rawProfile` in base64.

use kiln_api::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_api::types::v1::LabelPair;

use crate::error::ApiError;
use crate::wire::base64;

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonPushRequest {
    #[serde(default)]
    series: Vec<JsonSeries>,
}

#[derive(Debug, serde::Deserialize)]
struct JsonSeries {
    #[serde(default)]
    labels: Vec<JsonLabel>,
    #[serde(default)]
    samples: Vec<JsonSample>,
}

#[derive(Debug, serde::Deserialize)]
struct JsonLabel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, serde::Deserialize)]
struct JsonSample {
    #[serde(default, alias = "raw_profile")]
    #[serde(rename = "rawProfile")]
    raw_profile: String,
    #[serde(default, rename = "ID", alias = "id")]
    id: String,
}

/// Parses a JSON `PushRequest`.
pub fn push_request_from_json(body: &[u8]) -> Result<PushRequest, ApiError> {
    let bad = |message: String| ApiError::BadMessage {
        message_type: "push.v1.PushRequest JSON",
        message,
    };
    let parsed: JsonPushRequest = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let mut series = Vec::with_capacity(parsed.series.len());
    for (series_index, s) in parsed.series.into_iter().enumerate() {
        let mut samples = Vec::with_capacity(s.samples.len());
        for (sample_index, sample) in s.samples.into_iter().enumerate() {
            let raw_profile = base64::decode(&sample.raw_profile).ok_or_else(|| {
                bad(format!(
                    "series {series_index}, sample {sample_index}: rawProfile is not base64"
                ))
            })?;
            samples.push(RawSample {
                raw_profile,
                id: sample.id,
            });
        }
        series.push(RawProfileSeries {
            labels: s
                .labels
                .into_iter()
                .map(|l| LabelPair {
                    name: l.name,
                    value: l.value,
                })
                .collect(),
            samples,
        });
    }
    Ok(PushRequest { series })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_push_request_maps_fields() {
        let request = push_request_from_json(
            br#"{"series":[{"labels":[{"name":"__name__","value":"process_cpu"}],"samples":[{"rawProfile":"CgA=","ID":"x"}]}]}"#,
        )
        .unwrap();
        assert_eq!(request.series[0].labels[0].value, "process_cpu");
        assert_eq!(request.series[0].samples[0].raw_profile, [0x0a, 0x00]);
        let err = push_request_from_json(b"{\"series\": 3}").unwrap_err();
        assert!(
            err.to_string().contains("push.v1.PushRequest JSON"),
            "{err}"
        );
    }
}
