//! The messages around the profiles: a WriteRaw or Push request whose
//! `series` list holds 16.7M empty entries. Two bytes each on the wire
//! (33 KB gzipped for all of them), tens of bytes each once decoded and
//! again once split into uploads. These need a write token where one is
//! set; a leaked agent token or an SDK setup without tokens is enough.

use bytes::{Buf as _, BufMut as _};
use kiln_api::{PUSH_PATH, WRITE_RAW_PATH};
use kiln_testkit::wire::gzip;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::{Answer, Attack, Expect, Hostile};

/// Empty series that fill a 32 MiB body: `12 00` (field 2) in WriteRaw,
/// `0a 00` (field 1) in Push.
const EMPTY_SERIES: usize = (32 << 20) / 2 - 32;
/// Empty JSON series (`{},`) that fill 30 MB.
const EMPTY_JSON_SERIES: usize = 10_000_000;

/// Passes bytes through as the gRPC message, so that a test can send one
/// no prost type would encode without first allocating it decoded.
#[derive(Debug, Clone, Copy, Default)]
struct RawBytes;

impl Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> Self::Encoder {
        RawBytes
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytes
    }
}

impl Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut message = vec![0; src.remaining()];
        src.copy_to_slice(&mut message);
        Ok(Some(message))
    }
}

/// Sends `message` as one gzip-compressed gRPC call to `path`.
async fn grpc_call(url: String, path: &'static str, message: Vec<u8>) -> Answer {
    let channel = match tonic::transport::Endpoint::from_shared(url) {
        Ok(endpoint) => match endpoint.connect().await {
            Ok(channel) => channel,
            Err(err) => return Answer::Nothing(format!("connect: {err}")),
        },
        Err(err) => return Answer::Nothing(format!("endpoint: {err}")),
    };
    let mut grpc = tonic::client::Grpc::new(channel).send_compressed(CompressionEncoding::Gzip);
    if let Err(err) = grpc.ready().await {
        return Answer::Nothing(format!("not ready: {err}"));
    }
    let path = http::uri::PathAndQuery::from_static(path);
    match grpc
        .unary(tonic::Request::new(message), path, RawBytes)
        .await
    {
        Ok(_) => Answer::Grpc {
            code: tonic::Code::Ok,
            message: String::new(),
        },
        Err(status) => Answer::Grpc {
            code: status.code(),
            message: status.message().to_owned(),
        },
    }
}

#[test]
fn write_raw_of_16m_empty_series_gzipped() {
    let Some(attack) = Attack::start("write_raw_of_16m_empty_series_grpc_gzip") else {
        return;
    };
    let message = [0x12, 0x00].repeat(EMPTY_SERIES);
    let url = format!("http://{}", attack.addr());
    attack.run(|_| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let started = std::time::Instant::now();
        let answer = runtime.block_on(grpc_call(url, WRITE_RAW_PATH, message));
        vec![Hostile {
            what: format!("WriteRaw of {EMPTY_SERIES} empty series, grpc-encoding gzip"),
            expect: Expect::Refused,
            answer,
            took: started.elapsed(),
        }]
    });
}

#[test]
fn push_of_16m_empty_series_over_connect_gzipped() {
    let Some(attack) = Attack::start("push_of_16m_empty_series_connect_proto") else {
        return;
    };
    let body = gzip(&[0x0a, 0x00].repeat(EMPTY_SERIES));
    attack.run(|addr| {
        vec![Hostile::http(
            format!(
                "Push over Connect of {EMPTY_SERIES} empty series ({} bytes gzipped protobuf)",
                body.len()
            ),
            Expect::Refused,
            addr,
            "POST",
            PUSH_PATH,
            &[
                ("Content-Type", "application/proto"),
                ("Content-Encoding", "gzip"),
            ],
            &body,
        )]
    });
}

#[test]
fn push_of_10m_empty_json_series_gzipped() {
    let Some(attack) = Attack::start("push_of_10m_empty_series_connect_json") else {
        return;
    };
    let mut plain = b"{\"series\":[".to_vec();
    plain.extend_from_slice(&b"{},".repeat(EMPTY_JSON_SERIES));
    plain.extend_from_slice(b"{}]}");
    let body = gzip(&plain);
    drop(plain);
    attack.run(|addr| {
        vec![Hostile::http(
            format!(
                "Push over Connect of {EMPTY_JSON_SERIES} empty series ({} bytes gzipped JSON)",
                body.len()
            ),
            Expect::Refused,
            addr,
            "POST",
            PUSH_PATH,
            &[
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
            ],
            &body,
        )]
    });
}
