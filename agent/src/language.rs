//! Which runtime a process runs, from the objects it maps (pure): the
//! `language` label users filter profiles by.

use crate::proc_maps::{MapEntry, MappingKind};

/// A process's runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Language {
    /// CPython: a `python3.x` executable or a mapped `libpython3.x.so`
    /// (uWSGI, embedded interpreters).
    Python,
    /// The JVM (`libjvm.so`).
    Java,
    /// Node.js (`node` executable or `libnode.so`).
    Node,
    /// CRuby (`libruby.so`, or a `ruby` executable linked statically).
    Ruby,
    /// Anything else.
    Native,
}

impl Language {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Java => "java",
            Language::Node => "node",
            Language::Ruby => "ruby",
            Language::Native => "native",
        }
    }
}

/// Detects the runtime from a process's executable mappings.
pub fn detect(maps: &[MapEntry]) -> Language {
    let mut found = Language::Native;
    for entry in maps {
        let MappingKind::File { path, .. } = &entry.kind else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        let language = if name.starts_with("libjvm.so") {
            Language::Java
        } else if name.starts_with("libpython3") || is_python_executable(name) {
            Language::Python
        } else if name == "node" || name.starts_with("libnode.so") {
            Language::Node
        } else if name.starts_with("libruby") || is_ruby_executable(name) {
            Language::Ruby
        } else {
            continue;
        };
        // A runtime library wins over the executable's name (a Python
        // embedded in a JVM is rare; the JVM is then what the process is).
        found = found.min(language);
    }
    found
}

/// `ruby`, `ruby3.1`, not `rubyfmt`.
fn is_ruby_executable(name: &str) -> bool {
    name.strip_prefix("ruby")
        .is_some_and(|version| version.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// `python3`, `python3.11`, `python3.13t`, not `python3-config`.
fn is_python_executable(name: &str) -> bool {
    let Some(version) = name.strip_prefix("python3") else {
        return false;
    };
    version.is_empty()
        || version.strip_prefix('.').is_some_and(|v| {
            !v.is_empty() && v.trim_end_matches('t').bytes().all(|b| b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> MapEntry {
        MapEntry {
            start: 0,
            end: 1,
            file_offset: 0,
            executable: true,
            kind: MappingKind::File {
                path: path.to_owned(),
                deleted: false,
                device: 1,
                inode: 1,
            },
        }
    }

    #[test]
    fn runtimes_are_told_by_their_objects() {
        let libc = file("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(
            detect(&[file("/usr/bin/python3.11"), libc.clone()]),
            Language::Python
        );
        assert_eq!(
            detect(&[
                file("/usr/sbin/uwsgi"),
                file("/usr/lib/libpython3.12.so.1.0")
            ]),
            Language::Python
        );
        assert_eq!(
            detect(&[
                file("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
                file("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
            ]),
            Language::Java
        );
        assert_eq!(
            detect(&[file("/usr/bin/node"), libc.clone()]),
            Language::Node
        );
        assert_eq!(
            detect(&[
                file("/usr/bin/ruby3.1"),
                file("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1")
            ]),
            Language::Ruby
        );
        assert_eq!(detect(&[file("/usr/local/bin/ruby")]), Language::Ruby);
        assert_eq!(detect(&[file("/usr/bin/rubyfmt")]), Language::Native);
        assert_eq!(detect(&[file("/usr/bin/xz"), libc]), Language::Native);
        assert_eq!(detect(&[file("/usr/bin/python3-config")]), Language::Native);
        assert_eq!(detect(&[file("/opt/py/bin/python3.13t")]), Language::Python);
        assert_eq!(detect(&[]), Language::Native);
    }
}
