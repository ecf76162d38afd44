//! The port a target's pprof endpoint is scraped on: a number, or the name of
//! a container port of the pod (`spec.containers[].ports[].name`), as a
//! Service's `targetPort` names one. A name is resolved per pod, against the
//! ports the pod declares, by whoever sees the pod (the agent, from the
//! kubelet's copy of each container's ports in the runtime).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest port name (`IANA_SVC_NAME`, RFC 6335).
pub const MAX_PORT_NAME_LENGTH: usize = 15;

/// A pod port by number or by name. In the targets file a number is a JSON
/// number and a name a JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PprofPort {
    /// 1 to 65535.
    Number(u16),
    /// A container port's name: an `IANA_SVC_NAME` ([`is_port_name`]).
    Name(String),
}

/// Whether `name` is a port name as Kubernetes accepts one (`IANA_SVC_NAME`):
/// 1 to 15 lowercase letters, digits and `-`, at least one letter, no `-` at
/// either end and no `--`. A name of digits alone would read as a number.
pub fn is_port_name(name: &str) -> bool {
    (1..=MAX_PORT_NAME_LENGTH).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

impl PprofPort {
    /// Why this port cannot be scraped, if it cannot.
    pub fn problem(&self) -> Option<String> {
        match self {
            PprofPort::Number(0) => Some("must be 1 to 65535 or a port name".to_owned()),
            PprofPort::Number(_) => None,
            PprofPort::Name(name) if !is_port_name(name) => Some(format!(
                "{name:?} is not a port name (at most {MAX_PORT_NAME_LENGTH} lowercase letters, digits and -, with a letter, no - at either end, no --)"
            )),
            PprofPort::Name(_) => None,
        }
    }

    /// The number to scrape: a number as it is, a name as the first of
    /// `declared` (name, number) of that name; `None` for a name the pod
    /// does not declare, which is then not scraped at all (never another
    /// port).
    pub fn resolve<'a>(&self, declared: impl IntoIterator<Item = (&'a str, u16)>) -> Option<u16> {
        match self {
            PprofPort::Number(number) => Some(*number),
            PprofPort::Name(name) => declared
                .into_iter()
                .find(|(declared_name, _)| declared_name == name)
                .map(|(_, number)| number),
        }
    }
}

impl fmt::Display for PprofPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PprofPort::Number(number) => write!(f, "{number}"),
            PprofPort::Name(name) => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_names_are_iana_service_names() {
        for good in ["pprof", "http-debug", "a", "h2c", "80-x", "abcdefghijklmno"] {
            assert!(is_port_name(good), "{good}");
        }
        for bad in [
            "",
            "6060",
            "Pprof",
            "http_debug",
            "-pprof",
            "pprof-",
            "http--debug",
            "abcdefghijklmnop",
            "pprof ",
        ] {
            assert!(!is_port_name(bad), "{bad}");
        }
    }

    #[test]
    fn numbers_and_names_read_as_the_file_writes_them() {
        let number: PprofPort = serde_json::from_str("6060").unwrap();
        let name: PprofPort = serde_json::from_str("\"http-debug\"").unwrap();
        assert_eq!(number, PprofPort::Number(6060));
        assert_eq!(name, PprofPort::Name("http-debug".to_owned()));
        assert_eq!(serde_json::to_string(&number).unwrap(), "6060");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"http-debug\"");
        assert!(serde_json::from_str::<PprofPort>("70000").is_err());
        assert!(serde_json::from_str::<PprofPort>("-1").is_err());
        assert!(PprofPort::Number(0).problem().is_some());
        assert!(PprofPort::Name("6060".to_owned()).problem().is_some());
        assert_eq!(PprofPort::Name("pprof".to_owned()).problem(), None);
    }

    #[test]
    fn a_name_resolves_to_the_first_declared_port_of_that_name_or_to_nothing() {
        let declared = [("http", 8080), ("pprof", 6060), ("pprof", 7070)];
        let name = PprofPort::Name("pprof".to_owned());
        assert_eq!(name.resolve(declared), Some(6060));
        assert_eq!(
            PprofPort::Name("metrics".to_owned()).resolve(declared),
            None
        );
        assert_eq!(PprofPort::Name("pprof".to_owned()).resolve([]), None);
        // A number needs no declaration: pods often serve pprof on an undeclared port.
        assert_eq!(PprofPort::Number(6060).resolve([]), Some(6060));
        assert_eq!(name.to_string(), "pprof");
        assert_eq!(PprofPort::Number(6060).to_string(), "6060");
    }
}
