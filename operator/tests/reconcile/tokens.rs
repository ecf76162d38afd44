//! Issue 15. Without tokens, any pod could read and write every namespace's profiles. The
//! store's `<store>-tokens` Secret is created once with random tokens,
//! owned by the store, and never written again, so users may rotate the tokens themselves.

use http::Method;
use kiln_operator::controller::store;
use serde_json::{Value, json};

use super::fake_api::FakeApi;
use super::{DS_PATH, STS_PATH, current_store, setup, store_json};

const SECRETS_PATH: &str = "/api/v1/namespaces/kiln/secrets";
const SECRET_PATH: &str = "/api/v1/namespaces/kiln/secrets/main-tokens";

/// Decoded value of one key of the stored Secret.
fn secret_value(secret: &Value, key: &str) -> String {
    let encoded = secret["data"][key].as_str().expect("key is set");
    String::from_utf8(decode_base64(encoded)).expect("token is text")
}

/// Standard base64 with padding; enough for Secret data in a test.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in text.trim_end_matches('=').as_bytes().chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | (value(*c) << (18 - 6 * i)));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

fn secret_creates(fake: &FakeApi) -> usize {
    fake.writes()
        .iter()
        .filter(|c| c.method == Method::POST && c.path == SECRETS_PATH)
        .count()
}

fn container(fake: &FakeApi, path: &str) -> Value {
    fake.get(path).expect("workload exists")["spec"]["template"]["spec"]["containers"][0].clone()
}

#[tokio::test]
async fn tokens_secret_is_created_once_with_random_hex_tokens_owned_by_the_store() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(secret_creates(&fake), 1);
    let secret = fake.get(SECRET_PATH).expect("tokens Secret created");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "uid-main");
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["kind"],
        "ProfileStore"
    );
    let write = secret_value(&secret, "write-token");
    let read = secret_value(&secret, "read-token");
    for token in [&write, &read] {
        assert_eq!(token.len(), 64, "32 bytes in hex: {token}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    }
    assert_ne!(write, read);
    // Created before the workloads that read it.
    let writes: Vec<String> = fake.writes().iter().map(|c| c.path.clone()).collect();
    let created_at = writes.iter().position(|p| p == SECRETS_PATH);
    let sts_at = writes.iter().position(|p| p == STS_PATH);
    assert!(created_at < sts_at, "{writes:?}");

    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        secret_creates(&fake),
        0,
        "an existing Secret is not recreated"
    );
    assert_eq!(fake.get(SECRET_PATH).unwrap(), secret);
}

#[tokio::test]
async fn a_secret_the_user_rotated_is_left_untouched() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    let rotated = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "main-tokens", "namespace": "kiln", "resourceVersion": "7"},
        "data": {"write-token": "cm90YXRlZA==", "read-token": "cm90YXRlZA=="}});
    fake.put(SECRET_PATH, rotated.clone());
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        !fake
            .writes()
            .iter()
            .any(|c| c.path.starts_with(SECRETS_PATH)),
        "no write to the Secret: {:?}",
        fake.writes()
    );
    assert_eq!(fake.get(SECRET_PATH).unwrap(), rotated);
    // The workloads still read it.
    let env = container(&fake, STS_PATH)["env"].to_string();
    assert!(env.contains("main-tokens"), "{env}");
}

#[tokio::test]
async fn losing_the_create_race_keeps_the_other_writers_secret() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    // The read finds nothing, but the create collides with a Secret made meanwhile.
    fake.fail(Method::GET, SECRET_PATH, 404);
    fake.put(SECRET_PATH, json!({"metadata": {"name": "main-tokens"}}));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(secret_creates(&fake), 1);
    assert_eq!(
        fake.get(SECRET_PATH).unwrap(),
        json!({"metadata": {"name": "main-tokens"}})
    );
}

#[tokio::test]
async fn opting_out_of_write_tokens_drops_the_env_and_the_agent_mount() {
    let spec = json!({"auth": {"requireWriteToken": false}});
    let (fake, ctx) = setup(&store_json(spec, &[]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.get(SECRET_PATH).is_none(), "no token is required");
    assert_eq!(secret_creates(&fake), 0);
    let store_container = container(&fake, STS_PATH);
    assert!(!store_container.to_string().contains("KILN_WRITE_TOKENS"));
    let agent = fake.get(DS_PATH).unwrap().to_string();
    assert!(!agent.contains("KILN_STORE_TOKEN_FILE"), "{agent}");
    assert!(!agent.contains("main-tokens"), "{agent}");
}

#[tokio::test]
async fn read_tokens_alone_still_create_the_secret() {
    let spec = json!({"auth": {"requireWriteToken": false, "requireReadToken": true}});
    let (fake, ctx) = setup(&store_json(spec, &[]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.get(SECRET_PATH).is_some());
    let env = container(&fake, STS_PATH)["env"].clone();
    assert_eq!(env.as_array().map(Vec::len), Some(1), "{env}");
    assert_eq!(env[0]["name"], "KILN_READ_TOKENS");
    assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["key"], "read-token");
}
