//! A small in-memory API server behind `tower_test::mock`: enough of GET, LIST, server-side apply
//! (as replace), merge and JSON patches, status subresources, DELETE, creates (POST) and events for the
//! operator's calls. Every request is logged so scenarios can assert exactly what was written.
//! [`FakeApi::delete_namespace`] models namespace deletion: Terminating, refused creates,
//! deletionTimestamp and finalizers.

// Test support: a poisoned lock or a malformed request from the operator should fail the test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
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
    /// Namespaces being deleted: creating objects in them is refused.
    pub terminating: BTreeSet<String>,
    /// Remove an object with a deletionTimestamp once its last finalizer is gone, as the API
    /// server does. Off by default so scenarios can read a store right after its finalizer goes.
    pub honour_finalizers: bool,
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

    /// What the API server does on `kubectl delete namespace`: the namespace turns Terminating
    /// and creates in it are refused; objects without finalizers go at once, the others get a
    /// deletionTimestamp and go with their last finalizer; the namespace goes once it is empty.
    pub fn delete_namespace(&self, namespace: &str) {
        let mut state = self.state.lock().unwrap();
        state.honour_finalizers = true;
        state.terminating.insert(namespace.to_owned());
        let now = json!("2026-06-01T00:00:00Z");
        if let Some(object) = state.objects.get_mut(&namespace_path(namespace)) {
            object["metadata"]["deletionTimestamp"] = now.clone();
            object["status"]["phase"] = json!("Terminating");
        }
        let inside = format!("/namespaces/{namespace}/");
        for (path, object) in &mut state.objects {
            if path.contains(&inside) && object["metadata"]["deletionTimestamp"].is_null() {
                object["metadata"]["deletionTimestamp"] = now.clone();
            }
        }
        state.collect();
    }

    /// Paths of the objects stored in `namespace`.
    pub fn objects_in(&self, namespace: &str) -> Vec<String> {
        let inside = format!("/namespaces/{namespace}/");
        let state = self.state.lock().unwrap();
        state
            .objects
            .keys()
            .filter(|path| path.contains(&inside))
            .cloned()
            .collect()
    }
}

/// Where the Namespace object itself is stored.
pub fn namespace_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}")
}

/// The namespace a request path writes into, if any (`.../namespaces/<ns>/<plural>...`).
fn namespace_of(path: &str) -> Option<&str> {
    let mut segments = path.trim_matches('/').split('/');
    segments.find(|segment| *segment == "namespaces")?;
    let namespace = segments.next()?;
    segments.next().map(|_| namespace)
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
            // kube-rs recognises a missing object by its reason, not only its code.
            let reason = if *code == 404 { "NotFound" } else { "Injected" };
            return status(*code, reason, "injected failure");
        }
        let (path, subresource) = match call.path.strip_suffix("/status") {
            Some(base) => (base.to_owned(), true),
            None => (call.path.clone(), false),
        };
        match call.method {
            Method::GET => match self.objects.get(&path) {
                Some(object) => (StatusCode::OK, object.clone()),
                None if self.is_collection(&path) => {
                    (StatusCode::OK, self.list(&path, &call.query))
                }
                None => status(404, "NotFound", "not found"),
            },
            Method::PATCH if !self.objects.contains_key(&path) && self.refuses_create(&path) => {
                self.refused_create(&path)
            }
            Method::POST if self.refuses_create(&path) => self.refused_create(&path),
            Method::PATCH => {
                let answer = self.patch(&path, subresource, &call.body, content_type);
                self.collect();
                answer
            }
            Method::DELETE => self.delete(&path),
            Method::POST if path.ends_with("/events") => {
                let mut body = call.body.clone();
                body["metadata"]["name"] = json!(format!("event-{}", self.calls.len()));
                (StatusCode::CREATED, body)
            }
            Method::POST => self.create(&path, &call.body),
            _ => status(405, "MethodNotAllowed", "unsupported"),
        }
    }

    fn refuses_create(&self, path: &str) -> bool {
        namespace_of(path).is_some_and(|namespace| self.terminating.contains(namespace))
    }

    /// The API server's answers to a create in a namespace being deleted, or already gone.
    fn refused_create(&self, path: &str) -> (StatusCode, Value) {
        let namespace = namespace_of(path).unwrap_or("");
        if self.objects.contains_key(&namespace_path(namespace)) {
            let message = format!(
                "unable to create new content in namespace {namespace} because it is being terminated"
            );
            status(403, "Forbidden", &message)
        } else {
            status(
                404,
                "NotFound",
                &format!("namespaces \"{namespace}\" not found"),
            )
        }
    }

    /// A POST to a collection: stored under its name, refused when the name is taken.
    fn create(&mut self, collection: &str, body: &Value) -> (StatusCode, Value) {
        let Some(name) = body["metadata"]["name"].as_str() else {
            return status(422, "Invalid", "metadata.name is required");
        };
        let path = format!("{collection}/{name}");
        if self.objects.contains_key(&path) {
            return status(409, "AlreadyExists", &format!("{name} already exists"));
        }
        self.next_version += 1;
        let mut object = body.clone();
        object["metadata"]["resourceVersion"] = json!(self.next_version.to_string());
        self.objects.insert(path, object.clone());
        (StatusCode::CREATED, object)
    }

    /// An object with finalizers is only marked for deletion; the rest go at once.
    fn delete(&mut self, path: &str) -> (StatusCode, Value) {
        let Some(object) = self.objects.get_mut(path) else {
            return status(404, "NotFound", "not found");
        };
        let has_finalizers = object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|list| !list.is_empty());
        if has_finalizers {
            if object["metadata"]["deletionTimestamp"].is_null() {
                object["metadata"]["deletionTimestamp"] = json!("2026-06-01T00:00:00Z");
            }
            return (StatusCode::OK, object.clone());
        }
        let object = self.objects.remove(path).unwrap();
        self.collect();
        (StatusCode::OK, object)
    }

    /// Removes what the API server would: objects marked for deletion with no finalizer left,
    /// then terminating namespaces with nothing left in them.
    fn collect(&mut self) {
        if !self.honour_finalizers {
            return;
        }
        let namespaces: BTreeSet<String> = self
            .terminating
            .iter()
            .map(|ns| namespace_path(ns))
            .collect();
        self.objects.retain(|path, object| {
            // A namespace waits on its content (spec.finalizers), handled below.
            if namespaces.contains(path) {
                return true;
            }
            let marked = !object["metadata"]["deletionTimestamp"].is_null();
            let finalized = object["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
            !(marked && finalized)
        });
        for namespace in &self.terminating {
            let inside = format!("/namespaces/{namespace}/");
            if !self.objects.keys().any(|path| path.contains(&inside)) {
                self.objects.remove(&namespace_path(namespace));
            }
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

    fn list(&self, collection: &str, query: &str) -> Value {
        let selector = label_selector(query);
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
            .filter(|(_, object)| {
                selector
                    .iter()
                    .all(|(key, value)| object["metadata"]["labels"][key].as_str() == Some(value))
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
                    if !old["metadata"]["deletionTimestamp"].is_null() {
                        object["metadata"]["deletionTimestamp"] =
                            old["metadata"]["deletionTimestamp"].clone();
                    }
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
                    // A failed test fails the whole patch, so a stale index removes nothing.
                    Some("test")
                        if object.pointer(pointer).unwrap_or(&Value::Null) != &op["value"] =>
                    {
                        return status(422, "Invalid", &format!("test of {pointer} failed"));
                    }
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

/// The equality terms of a list call's `labelSelector` (`k=v,k2=v2`, percent-encoded), the only
/// form the operator sends.
fn label_selector(query: &str) -> Vec<(String, String)> {
    let Some(encoded) = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("labelSelector="))
    else {
        return Vec::new();
    };
    let mut decoded = Vec::new();
    let bytes = encoded.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' if at + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[at + 1..at + 3]).unwrap();
                decoded.push(u8::from_str_radix(hex, 16).unwrap());
                at += 3;
            }
            b'+' => {
                decoded.push(b' ');
                at += 1;
            }
            byte => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded)
        .unwrap()
        .split(',')
        .filter_map(|term| term.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}
