//! The embedded assets are complete and well-formed: everything index.html
//! and the modules reference is served, every file in `assets/` is
//! embedded, every module parses, and the pure modules' unit tests pass.

use kiln_testkit::tools::node;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Attribute values of `attr="..."` in `html`.
fn attribute_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
    let needle = format!("{attr}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        if let Some(end) = rest.find('"') {
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

/// Relative module specifiers in `import ... from './x.js'` statements.
fn relative_imports(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for quote in ['\'', '"'] {
        let needle = format!("from {quote}./");
        let mut rest = source;
        while let Some(at) = rest.find(&needle) {
            rest = &rest[at + needle.len()..];
            if let Some(end) = rest.find(quote) {
                out.push(rest[..end].to_owned());
            }
        }
    }
    out
}

fn local_reference(reference: &str) -> Option<&str> {
    let external = reference.starts_with('#')
        || reference.contains("://")
        || reference.starts_with("data:")
        || reference.starts_with("mailto:")
        || reference == "./";
    (!external).then_some(reference)
}

#[test]
fn everything_index_html_references_is_served() {
    let index = kiln_ui::asset("/").expect("index.html is served");
    let html = std::str::from_utf8(index.bytes).expect("index.html is UTF-8");
    let mut references: Vec<&str> = attribute_values(html, "src");
    references.extend(attribute_values(html, "href"));
    let local: Vec<&str> = references.into_iter().filter_map(local_reference).collect();
    assert!(
        local.contains(&"js/app.js"),
        "index.html loads the app module"
    );
    assert!(
        local.contains(&"style.css"),
        "index.html loads the stylesheet"
    );
    for reference in local {
        assert!(
            kiln_ui::asset(reference).is_some(),
            "index.html references {reference}, which is not embedded"
        );
    }
}

#[test]
fn every_module_import_is_served() {
    for path in kiln_ui::asset_paths().filter(|p| p.ends_with(".js")) {
        let asset = kiln_ui::asset(path).expect("listed assets are served");
        let source = std::str::from_utf8(asset.bytes).expect("modules are UTF-8");
        let dir = Path::new(path)
            .parent()
            .expect("modules live in a directory");
        for import in relative_imports(source) {
            let target = dir.join(&import);
            let target = target.to_str().expect("asset paths are UTF-8");
            assert!(
                kiln_ui::asset(target).is_some(),
                "{path} imports ./{import}, which is not embedded"
            );
        }
    }
}

#[test]
fn every_file_in_the_assets_folder_is_embedded() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    let mut on_disk = BTreeSet::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("assets folder is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path.strip_prefix(&root).expect("inside assets");
                on_disk.insert(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    // package.json only tells node the files are modules; it is not served.
    on_disk.remove("package.json");
    let embedded: BTreeSet<String> = kiln_ui::asset_paths().map(str::to_owned).collect();
    assert_eq!(on_disk, embedded, "assets/ and the embedded list differ");
}

#[test]
fn every_javascript_module_parses_under_node() {
    let Some(node) = node() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    for path in kiln_ui::asset_paths().filter(|p| p.ends_with(".js")) {
        let output = Command::new(&node)
            .arg("--check")
            .arg(root.join(path))
            .output()
            .expect("node runs");
        assert!(
            output.status.success(),
            "node --check {path} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn pure_module_unit_tests_pass_under_node() {
    let Some(node) = node() else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/js is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.js"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no JavaScript unit tests found in {}",
        dir.display()
    );
    let output = Command::new(&node)
        .arg("--test")
        .args(&files)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "node --test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("# fail 0"),
        "unexpected node --test output:\n{stdout}"
    );
}
