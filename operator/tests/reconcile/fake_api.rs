//! A small in-memory API server behind `tower_test::mock`: enough of GET, LIST, server-side apply
//! (as replace), merge and JSON patches, status subresources, DELETE and event POSTs for the
//! operator's calls. Every request is logged so scenarios can assert exactly what was written.

// Test support: a poisoned lock or a malformed request from the operator should fail the test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kube::Client;
use serde_json::{Value, json};

/// One logged request.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

impl Call {
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

#[derive(Debug, Default)]
pub struct State {
    pub objects: BTreeMap<String, Value>,
    pub calls: Vec<Call>,
    /// (method, path) pairs that answer with this status code instead.
    pub failures: Vec<(Method, String, u16)>,
    next_version: u64,
}

/// Handle on the fake: its state and the client talking to it.
#[derive(Clone)]
pub struct FakeApi {
    pub state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// Starts the fake on the current runtime and returns it with a client.
    pub fn start() -> (Self, Client) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<kube::client::Body>, Response<Full<Bytes>>>();
        let fake = Self {
            state: Arc::default(),
        };
        let state = fake.state.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let content_type = parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let call = Call {
                    method: parts.method.clone(),
                    path: parts.uri.path().to_owned(),
                    query: parts.uri.query().unwrap_or("").to_owned(),
                    body,
                };
                let (status, answer) = state.lock().unwrap().handle(call, &content_type);
                let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
                *response.status_mut() = status;
                respond.send_response(response);
            }
        });
        (fake, Client::new(service, "default"))
    }

    pub fn put(&self, path: &str, object: Value) {
        self.state
            .lock()
            .unwrap()
            .objects
            .insert(path.to_owned(), object);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    pub fn fail(&self, method: Method, path: &str, code: u16) {
        self.state
            .lock()
            .unwrap()
            .failures
            .push((method, path.to_owned(), code));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn writes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(Call::is_write).collect()
    }

    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }
}

fn status(code: u16, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

impl State {
    fn handle(&mut self, call: Call, content_type: &str) -> (StatusCode, Value) {
        self.calls.push(call.clone());
        if let Some((_, _, code)) = self
            .failures
            .iter()
            .find(|(m, p, _)| *m == call.method && *p == call.path)
        {
            return status(*code, "Injected", "injected failure");
        }
        let (path, subresource) = match call.path.strip_suffix("/status") {
            Some(base) => (base.to_owned(), true),
            None => (call.path.clone(), false),
        };
        match call.method {
            Method::GET => match self.objects.get(&path) {
                Some(object) => (StatusCode::OK, object.clone()),
                None if self.is_collection(&path) => (StatusCode::OK, self.list(&path)),
                None => status(404, "NotFound", "not found"),
            },
            Method::PATCH => self.patch(&path, subresource, &call.body, content_type),
            Method::DELETE => match self.objects.remove(&path) {
                Some(object) => (StatusCode::OK, object),
                None => status(404, "NotFound", "not found"),
            },
            Method::POST => {
                let mut body = call.body.clone();
                body["metadata"]["name"] = json!(format!("event-{}", self.calls.len()));
                (StatusCode::CREATED, body)
            }
            _ => status(405, "MethodNotAllowed", "unsupported"),
        }
    }

    /// A path is a collection when no stored object sits there and its last segment is a plural.
    fn is_collection(&self, path: &str) -> bool {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let core = segments.first() == Some(&"api");
        // /api/v1/<plural> | /api/v1/namespaces/<ns>/<plural> | /apis/<g>/<v>/<plural> | .../namespaces/<ns>/<plural>
        let base = if core { 2 } else { 3 };
        segments.len() == base + 1 || (segments.len() == base + 3 && segments[base] == "namespaces")
    }

    fn list(&self, collection: &str) -> Value {
        let plural = collection.rsplit('/').next().unwrap_or("");
        let segments: Vec<&str> = collection.trim_matches('/').split('/').collect();
        let group_prefix = if segments[0] == "api" {
            "/api/v1/".to_owned()
        } else {
            format!("/apis/{}/{}/", segments[1], segments[2])
        };
        let own_prefix = format!("{collection}/");
        let namespaced_prefix = format!("{group_prefix}namespaces/");
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(path, _)| {
                path.starts_with(&own_prefix)
                    || (!collection.contains("/namespaces/")
                        && path.starts_with(&namespaced_prefix)
                        && path.rsplit('/').nth(1) == Some(plural))
            })
            .map(|(_, object)| object.clone())
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
    }

    fn patch(
        &mut self,
        path: &str,
        subresource: bool,
        body: &Value,
        content_type: &str,
    ) -> (StatusCode, Value) {
        self.next_version += 1;
        let version = self.next_version.to_string();
        let existing = self.objects.get(path).cloned();
        let updated = if content_type.starts_with("application/apply-patch") {
            if subresource {
                let Some(mut object) = existing else {
                    return status(404, "NotFound", "not found");
                };
                object["status"] = body["status"].clone();
                object
            } else {
                let mut object = body.clone();
                if let Some(old) = &existing {
                    // Apply never touches status or the server-set metadata.
                    object["status"] = old["status"].clone();
                    object["metadata"]["uid"] = old["metadata"]["uid"].clone();
                    object["metadata"]["generation"] = old["metadata"]["generation"].clone();
                }
                object
            }
        } else if content_type.starts_with("application/merge-patch") {
            let Some(mut object) = existing else {
                return status(404, "NotFound", "not found");
            };
            merge(&mut object, body);
            object
        } else if content_type.starts_with("application/json-patch") {
            let Some(mut object) = existing else {
                return status(404, "NotFound", "not found");
            };
            for op in body.as_array().into_iter().flatten() {
                let pointer = op["path"].as_str().unwrap_or("");
                match op["op"].as_str() {
                    Some("add") if pointer.ends_with("/-") => {
                        let list = pointer.trim_end_matches("/-");
                        if let Some(array) = object.pointer_mut(list).and_then(Value::as_array_mut)
                        {
                            array.push(op["value"].clone());
                        }
                    }
                    Some("add") if pointer == "/metadata/finalizers" => {
                        object["metadata"]["finalizers"] = op["value"].clone();
                    }
                    Some("remove") => {
                        let (list, index) = pointer.rsplit_once('/').unwrap();
                        let index: usize = index.parse().unwrap();
                        if let Some(array) = object.pointer_mut(list).and_then(Value::as_array_mut)
                        {
                            array.remove(index);
                        }
                    }
                    _ => {}
                }
            }
            object
        } else {
            return status(415, "UnsupportedMediaType", content_type);
        };
        let mut updated = updated;
        updated["metadata"]["resourceVersion"] = json!(version);
        self.objects.insert(path.to_owned(), updated.clone());
        (StatusCode::OK, updated)
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}
