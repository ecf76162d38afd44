//! A container's named ports, from the pod spec as kubelet copies it onto
//! the container: the annotation `io.kubernetes.container.ports`, the JSON
//! of `spec.containers[].ports` (`[{"name":"pprof","containerPort":6060,
//! "protocol":"TCP"}]`), written by every kubelet since 1.x and what it
//! reads back itself after a restart. The agent never asks the API server,
//! so this is how a target's `pprof.port` name finds its number. Pure.

use std::collections::HashMap;

/// The container annotation kubelet writes the container's ports into.
pub const ANNOTATION_CONTAINER_PORTS: &str = "io.kubernetes.container.ports";

/// Most named ports kept per container; a pod spec declares a handful.
const MAX_NAMED_PORTS: usize = 64;

/// The named TCP ports of a container, in the order the pod spec lists them,
/// as (name, number). Unnamed ports, other protocols, numbers outside
/// 1..=65535 and a missing or malformed annotation give nothing: a name
/// then resolves to no port and the pod is not scraped, never scraped on a
/// guess.
pub fn named_ports(annotations: &HashMap<String, String>) -> Vec<(String, u16)> {
    let Some(ports) = annotations
        .get(ANNOTATION_CONTAINER_PORTS)
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
    else {
        return Vec::new();
    };
    ports
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|port| {
            let name = port.get("name")?.as_str().filter(|n| !n.is_empty())?;
            let number = u16::try_from(port.get("containerPort")?.as_u64()?)
                .ok()
                .filter(|&n| n > 0)?;
            // The API server defaults the protocol to TCP; pprof is HTTP.
            let tcp = port
                .get("protocol")
                .and_then(serde_json::Value::as_str)
                .is_none_or(|protocol| protocol == "TCP");
            tcp.then(|| (name.to_owned(), number))
        })
        .take(MAX_NAMED_PORTS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(json: &str) -> HashMap<String, String> {
        HashMap::from([(ANNOTATION_CONTAINER_PORTS.to_owned(), json.to_owned())])
    }

    #[test]
    fn named_tcp_ports_in_spec_order() {
        // As kubelet writes it for CoreDNS, plus an unnamed and an out-of-range port.
        let ports = named_ports(&annotated(
            r#"[{"name":"dns","containerPort":53,"protocol":"UDP"},
                {"name":"dns-tcp","containerPort":53,"protocol":"TCP"},
                {"name":"metrics","containerPort":9153,"protocol":"TCP"},
                {"containerPort":8080,"protocol":"TCP"},
                {"name":"big","containerPort":70000},
                {"name":"pprof","containerPort":6060}]"#,
        ));
        assert_eq!(
            ports,
            [
                ("dns-tcp".to_owned(), 53),
                ("metrics".to_owned(), 9153),
                ("pprof".to_owned(), 6060)
            ]
        );
    }

    #[test]
    fn no_or_malformed_annotation_gives_no_ports() {
        assert!(named_ports(&HashMap::new()).is_empty());
        assert!(named_ports(&annotated("not json")).is_empty());
        assert!(named_ports(&annotated(r#"{"name":"pprof"}"#)).is_empty());
        assert!(named_ports(&annotated("[]")).is_empty());
    }
}
