//! The UI in a real browser: starts `kiln-store` on 127.0.0.1 with an
//! empty data directory and drives Debian's Chromium headless with
//! playwright-core. `tests/browser/ui_flow.mjs`, on real pprof fixtures of
//! two pods from ../shared: select a pod, see the flame graph, zoom, search,
//! brush the timeline, download pprof, compare. `tests/browser/host_view.mjs`,
//! on real CPU profiles of three processes made at test time: the host view
//! grouped by `comm`, the sandwich view, downloads, and every view restored
//! from its link. Screenshots land in `<target>/ui-artifacts/`.

#[path = "support/go_workloads.rs"]
mod go_workloads;
#[path = "support/prerequisites.rs"]
mod prerequisites;
#[path = "support/store_process.rs"]
mod store_process;

use std::path::PathBuf;
use std::process::Command;

fn chromium() -> Option<PathBuf> {
    let path = PathBuf::from(
        std::env::var_os("KILN_CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into()),
    );
    if path.is_file() {
        Some(path)
    } else {
        prerequisites::missing(&format!("Chromium is not installed at {}", path.display()))
    }
}

fn playwright() -> Option<PathBuf> {
    let tools = std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
    let package = PathBuf::from(tools).join("node_modules/playwright-core");
    if package.join("package.json").is_file() {
        Some(package)
    } else {
        prerequisites::missing(&format!(
            "playwright-core is not installed in {}",
            package.display()
        ))
    }
}

#[test]
fn ui_shows_selects_zooms_searches_and_compares_profiles_in_chromium() {
    let Some(fixtures) = prerequisites::profile_fixtures() else {
        return;
    };
    run_flow(
        "ui_flow.mjs",
        &[],
        &[("KILN_FIXTURES", fixtures.into_os_string())],
    );
}

#[test]
fn ui_groups_a_host_by_process_opens_a_sandwich_and_restores_each_view_from_its_link() {
    let work = tempfile::tempdir().expect("temporary directory");
    let Some(profiles) = go_workloads::cpu_profiles(work.path()) else {
        return;
    };
    // Like the agent: every sample names its process (`comm`, `pid`), which
    // the store keeps per sample rather than as series labels.
    let list: Vec<String> = profiles
        .iter()
        .enumerate()
        .map(|(index, (service, path))| {
            let pid = (4100 + index).to_string();
            let labelled = path.with_extension("labelled.pprof");
            let bytes = std::fs::read(path).expect("profile written");
            let bytes = label_every_sample(&bytes, &[("comm", service), ("pid", &pid)]);
            std::fs::write(&labelled, bytes).expect("labelled profile written");
            format!("{service}={}", labelled.display())
        })
        .collect();
    run_flow(
        "host_view.mjs",
        &[],
        &[("KILN_PROFILES", list.join("\n").into())],
    );
}

#[test]
fn ui_asks_for_a_read_token_once_and_keeps_it_out_of_the_url() {
    let secrets = tempfile::tempdir().expect("temporary directory");
    let tokens = secrets.path().join("read-tokens");
    std::fs::write(&tokens, "kiln-read-secret\n").expect("token file written");
    run_flow(
        "read_token.mjs",
        &["--read-tokens-file", tokens.to_str().expect("utf-8 path")],
        &[("KILN_READ_TOKEN", "kiln-read-secret".into())],
    );
}

/// `profile` (gzipped pprof) with string labels `labels` added to every sample.
fn label_every_sample(profile: &[u8], labels: &[(&str, &str)]) -> Vec<u8> {
    use prost::Message;
    let plain = kiln_pprof::maybe_gunzip(profile, 64 << 20).expect("a gzipped profile");
    let mut profile = kiln_pprof::proto::Profile::decode(&plain[..]).expect("a pprof profile");
    let mut string = |text: &str| {
        profile.string_table.push(text.as_bytes().to_vec());
        i64::try_from(profile.string_table.len() - 1).expect("small string table")
    };
    let labels: Vec<kiln_pprof::proto::Label> = labels
        .iter()
        .map(|(key, value)| kiln_pprof::proto::Label {
            key: string(key),
            str: string(value),
            ..Default::default()
        })
        .collect();
    for sample in &mut profile.sample {
        sample.label.extend(labels.iter().cloned());
    }
    kiln_pprof::encode_gzip(&profile)
}

/// Starts a store with `store_args` and runs `tests/browser/<script>`
/// against it with `env`.
fn run_flow(script: &str, store_args: &[&str], env: &[(&str, std::ffi::OsString)]) {
    let Some(node) = prerequisites::node() else {
        return;
    };
    let Some(chromium) = chromium() else { return };
    let Some(playwright) = playwright() else {
        return;
    };
    let Some(store_binary) = prerequisites::built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };

    let store = store_process::StoreProcess::start_with(&store_binary, store_args);
    // The store must serve exactly the assets in this checkout; a stale
    // binary would test an old UI.
    for path in kiln_ui::asset_paths() {
        let embedded = kiln_ui::asset(path).expect("listed assets are served");
        let served = store_process::http_get(store.port(), &format!("/{path}"));
        assert!(
            served
                .as_ref()
                .is_some_and(|(status, body)| *status == 200 && body == embedded.bytes),
            "{} does not serve /{path} as embedded in this checkout; rebuild it with `cargo build -p kiln-store`",
            store_binary.display()
        );
    }
    let artifacts = prerequisites::target_dir().join("ui-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact directory can be created");
    eprintln!("UI screenshots: {}", artifacts.display());

    let script = prerequisites::crate_dir()
        .join("tests/browser")
        .join(script);
    let output = Command::new(node)
        .arg(&script)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KILN_URL", store.url())
        .env("KILN_ARTIFACTS", &artifacts)
        .env("KILN_CHROMIUM", &chromium)
        .env("KILN_PLAYWRIGHT", &playwright)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        output.status.success(),
        "the browser flow failed (store log below)\n{}",
        store.log()
    );
    assert!(
        stdout.contains("all UI steps passed"),
        "the browser flow did not finish"
    );
}
