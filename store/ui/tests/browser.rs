//! The UI in a real browser: starts `kiln-store` on 127.0.0.1 with an
//! empty data directory and drives Debian's Chromium headless with
//! playwright-core. `tests/browser/ui_flow.mjs`, on real CPU profiles of
//! two pods, made at test time by `tests/programs/pods` and, where present,
//! the fixtures in ../shared: select a pod, see the flame graph, zoom,
//! search, brush the timeline, download pprof, compare. `tests/browser/host_view.mjs`,
//! on real CPU profiles of three processes made at test time: the host view
//! grouped by `comm`, the sandwich view, downloads, and every view restored
//! from its link. Screenshots land in `<target>/ui-artifacts/`.

use kiln_testkit::binaries::{built_binary, target_dir};
use kiln_testkit::fixtures::shared_testdata;
use kiln_testkit::go_programs::workload_cpu_profiles;
use kiln_testkit::http::http_get;
use kiln_testkit::prerequisites::missing;
use kiln_testkit::store_process::StoreProcess;
use kiln_testkit::tools::node;
use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> Option<PathBuf> {
    let path = PathBuf::from(
        std::env::var_os("KILN_CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into()),
    );
    if path.is_file() {
        Some(path)
    } else {
        missing(&format!("Chromium is not installed at {}", path.display()))
    }
}

fn playwright() -> Option<PathBuf> {
    let tools = std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
    let package = PathBuf::from(tools).join("node_modules/playwright-core");
    if package.join("package.json").is_file() {
        Some(package)
    } else {
        missing(&format!(
            "playwright-core is not installed in {}",
            package.display()
        ))
    }
}

#[test]
fn ui_shows_selects_zooms_searches_and_compares_profiles_in_chromium() {
    let Some(fixtures) = shared_testdata("profiles") else {
        return;
    };
    run_flow(
        "ui_flow.mjs",
        &[],
        &[
            (
                "KILN_PROFILE_CHECKOUT",
                fixtures.join("google-pprof/sample.cpu.pb.gz").into(),
            ),
            (
                "KILN_PROFILE_SEARCH",
                fixtures.join("google-pprof/large.cpu.pb.gz").into(),
            ),
        ],
    );
}

/// Twin of the test above that needs no `../shared`: the same flow on the
/// CPU profiles of two pods that `tests/programs/pods` writes now.
#[test]
fn ui_shows_selects_zooms_searches_and_compares_go_profiles_made_now_in_chromium() {
    let work = tempfile::tempdir().expect("temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pods/main.go");
    let Some(binary) = kiln_testkit::go_programs::build(&source, work.path(), "pods") else {
        return;
    };
    let runs: Vec<_> = ["checkout", "search"]
        .iter()
        .map(|pod| {
            let profile = work.path().join(format!("{pod}.pprof"));
            let child = Command::new(&binary)
                .arg(pod)
                .arg(&profile)
                .spawn()
                .expect("the pods program starts");
            (pod, profile, child)
        })
        .collect();
    let mut profiles = Vec::new();
    for (pod, profile, mut child) in runs {
        let status = child.wait().expect("the pods program runs");
        assert!(status.success(), "pods {pod} failed: {status}");
        profiles.push(profile);
    }
    // The frames `pods` puts on its stacks (see its main.go). The shares
    // are not checked: a rare sample of the profiler's own goroutine would
    // move them.
    let expected = serde_json::json!({
        "top": "main.hashRound",
        "hot": "main.busyLoop",
        "hotShare": null,
        "hotSource": r"main\.go:\d+",
        "other": "main.scanIndex",
        "zoom": "main.shuffle",
        "zoomShare": null,
        "zoomPath": ["All", "runtime.main", "main.main", "main.busyLoop", "main.shuffle"],
    });
    run_flow(
        "ui_flow.mjs",
        &[],
        &[
            ("KILN_PROFILE_CHECKOUT", profiles[0].clone().into()),
            ("KILN_PROFILE_SEARCH", profiles[1].clone().into()),
            ("KILN_EXPECT", expected.to_string().into()),
        ],
    );
}

#[test]
fn ui_groups_a_host_by_process_opens_a_sandwich_and_restores_each_view_from_its_link() {
    let work = tempfile::tempdir().expect("temporary directory");
    let Some(profiles) = workload_cpu_profiles(work.path()) else {
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
    let Some(node) = node() else {
        return;
    };
    let Some(chromium) = chromium() else { return };
    let Some(playwright) = playwright() else {
        return;
    };
    let Some(store_binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };

    let store = StoreProcess::start(&store_binary, store_args);
    // The store must serve exactly the assets in this checkout; a stale
    // binary would test an old UI.
    for path in kiln_ui::asset_paths() {
        let embedded = kiln_ui::asset(path).expect("listed assets are served");
        let served = http_get(store.port(), &format!("/{path}"));
        assert!(
            served
                .as_ref()
                .is_some_and(|(status, body)| *status == 200 && body == embedded.bytes),
            "{} does not serve /{path} as embedded in this checkout; rebuild it with `cargo build -p kiln-store`",
            store_binary.display()
        );
    }
    let artifacts = target_dir().join("ui-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact directory can be created");
    eprintln!("UI screenshots: {}", artifacts.display());

    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
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
