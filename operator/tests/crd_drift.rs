//! The checked-in CRD YAML must equal what the Rust types render. `KILN_BLESS=1 cargo test -p
//! kiln-operator --test crd_drift` rewrites every copy (the one bless variable of every drift
//! test).

use std::path::PathBuf;

/// Every place a copy of the CRDs lives, relative to the repository root.
const CRD_DIRS: [&str; 3] = ["crds", "config/crd/bases", "charts/kiln/crds"];

fn repo_root() -> PathBuf {
    // Canonical, so a symlinked checkout still points at the real repository.
    std::fs::canonicalize(env!("CARGO_MANIFEST_DIR"))
        .expect("manifest dir exists")
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let rendered = kiln_operator::crd::render_crds().expect("CRDs render");
    let update = std::env::var_os("KILN_BLESS").is_some();
    let mut drifted = Vec::new();
    for dir in CRD_DIRS {
        let dir = repo_root().join(dir);
        for (file, yaml) in &rendered {
            let path = dir.join(file);
            if update {
                std::fs::create_dir_all(&dir).expect("create CRD dir");
                std::fs::write(&path, yaml).expect("write CRD");
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(on_disk) if &on_disk == yaml => {}
                _ => drifted.push(path.display().to_string()),
            }
        }
    }
    assert!(
        drifted.is_empty(),
        "CRD YAML drifted from the Rust types: {drifted:?}\nrun: KILN_BLESS=1 cargo test -p kiln-operator --test crd_drift"
    );
}

#[test]
fn crds_stay_small_enough_for_client_side_apply() {
    // kubectl's last-applied annotation caps objects at 262144 bytes; keep a wide margin.
    for (file, yaml) in kiln_operator::crd::render_crds().expect("CRDs render") {
        assert!(yaml.len() < 64 * 1024, "{file} is {} bytes", yaml.len());
    }
}
