//! Layering and resolution of the whole configuration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};

use super::*;

/// What `load` does, without the process environment: `args` parsed by
/// clap laid over the file text (if any), then token files from `files`.
fn layered(file: Option<&str>, args: &[&str]) -> Result<Config, ConfigError> {
    let mut settings = match file {
        Some(text) => parse_file_settings(text, Path::new("kiln.toml"))?,
        None => StoreSettings::default(),
    };
    let matches = StoreSettings::command()
        .try_get_matches_from(std::iter::once("kiln-store").chain(args.iter().copied()))
        .map_err(|error| ConfigError::Arguments {
            message: error.to_string(),
        })?;
    settings
        .update_from_arg_matches(&matches)
        .map_err(|error| ConfigError::Arguments {
            message: error.to_string(),
        })?;
    Config::resolve(&settings, Some("host".into()))
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let config = Config::resolve(&StoreSettings::default(), None).unwrap();
    assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 7470)));
    assert_eq!(config.flush_interval, Duration::from_secs(60));
    assert_eq!(config.relist_interval, Duration::from_secs(15));
    assert_eq!(config.retention, Duration::from_secs(14 * 86_400));
    assert_eq!(config.max_future_skew, Duration::from_secs(600));
    assert_eq!(config.query_timeout, Duration::from_secs(30));
    assert_eq!(config.bucket.kind, ObjectStoreKind::Local);
    assert_eq!(config.limits, Limits::default());
    assert_eq!(config.connections, ConnectionLimits::default());
    assert_eq!(config.bucket.name, "kiln-data/bucket");
    assert_eq!(config.replica, "kiln");
    assert_eq!(config.log, "info");
    assert!(config.write_tokens.is_empty());
}

#[test]
fn every_write_in_flight_gets_a_blocking_thread_beside_the_default_pool() {
    let config = layered(None, &["--max-inflight", "500"]).unwrap();
    assert_eq!(
        config.limits.blocking_threads(),
        BLOCKING_THREADS_BESIDE_WRITES + 500
    );
    let config = Config::resolve(&StoreSettings::default(), None).unwrap();
    assert_eq!(
        config.limits.blocking_threads(),
        BLOCKING_THREADS_BESIDE_WRITES + 256
    );
}

#[test]
fn file_overrides_defaults_and_flags_override_the_file() {
    let file = r#"
version = 1
[server]
listen = "0.0.0.0:9000"
idle_timeout = "30s"
[storage]
flush_interval = "15s"
replica = "from-file"
[bucket]
kind = "s3"
name = "profiles"
endpoint = "http://127.0.0.1:5000"
allow_http = true
[limits]
max_inflight = 8
max_series = 7
[auth]
write_tokens = ["w1"]
"#;
    let config = layered(
        Some(file),
        &[
            "--replica",
            "from-cli",
            "--max-inflight",
            "16",
            "--idle-timeout=5s",
        ],
    )
    .unwrap();
    assert_eq!(config.listen, SocketAddr::from(([0, 0, 0, 0], 9000)));
    assert_eq!(config.flush_interval, Duration::from_secs(15));
    assert_eq!(config.replica, "from-cli");
    assert_eq!(config.limits.max_inflight, 16);
    assert_eq!(config.limits.max_series, 7);
    assert_eq!(config.connections.idle_timeout, Duration::from_secs(5));
    assert_eq!(config.bucket.kind, ObjectStoreKind::S3);
    assert_eq!(config.bucket.name, "profiles");
    assert!(config.bucket.allow_http);
    assert_eq!(config.write_tokens, ["w1"]);
}

#[test]
fn unknown_keys_and_versions_in_the_file_are_refused() {
    let err =
        parse_file_settings("version = 1\nlisten = \"x\"\n", Path::new("k.toml")).unwrap_err();
    assert!(err.to_string().contains("unknown field `listen`"), "{err}");
    let err = parse_file_settings("version = 2\n", Path::new("k.toml")).unwrap_err();
    assert_eq!(err.reason(), "config_version");
    let err = parse_file_settings("[server]\n", Path::new("k.toml")).unwrap_err();
    assert!(err.to_string().contains("version"), "{err}");
    let err =
        parse_file_settings("version = 1\nconfig = \"x\"\n", Path::new("k.toml")).unwrap_err();
    assert!(err.to_string().contains("unknown field `config`"), "{err}");
}

#[test]
fn bad_values_name_the_setting() {
    let err = layered(None, &["--object-store", "s3"]).unwrap_err();
    assert!(err.to_string().contains("bucket.name"), "{err}");
    let err = layered(None, &["--flush-interval", "fast"]).unwrap_err();
    assert!(err.to_string().contains("storage.flush_interval"), "{err}");
    let err = layered(None, &["--query-timeout", "0s"]).unwrap_err();
    assert!(err.to_string().contains("storage.query_timeout"), "{err}");
    for bad in ["0", "17"] {
        let err = layered(None, &["--head-shards", bad]).unwrap_err();
        assert!(err.to_string().contains("storage.head_shards"), "{err}");
    }
    assert_eq!(
        layered(None, &["--head-shards", "4"]).unwrap().head_shards,
        Some(4)
    );
    for bad in ["0", "1025"] {
        let err = layered(None, &["--ingest-workers", bad]).unwrap_err();
        assert!(err.to_string().contains("storage.ingest_workers"), "{err}");
    }
    assert_eq!(
        layered(None, &["--ingest-workers", "3"])
            .unwrap()
            .ingest_workers,
        Some(3)
    );
    let err = layered(None, &["--max-inflight", "0"]).unwrap_err();
    assert!(err.to_string().contains("limits.max_inflight"), "{err}");
    let err = layered(None, &["--object-store", "azure", "--bucket", "b"]).unwrap_err();
    assert!(err.to_string().contains("bucket.azure_account"), "{err}");
}

#[test]
fn memory_budget_parses_quantities_and_refuses_tiny_or_bad_values() {
    let config = Config::resolve(&StoreSettings::default(), None).unwrap();
    assert_eq!(config.memory_budget, 2 << 30);
    assert_eq!(config.compaction_interval, Duration::from_secs(300));
    let config = layered(None, &["--memory-budget", "1536Mi"]).unwrap();
    assert_eq!(config.memory_budget, 1536 << 20);
    assert_eq!(config.limits.max_inflight_queries, 48, "one per 32 MiB");
    assert_eq!(config.limits.query_memory_bytes, 384 << 20, "a quarter");
    assert_eq!(config.connections.max_connections, 3072, "one per 512 KiB");
    let config = layered(None, &["--query-memory-bytes", "8388608"]).unwrap();
    assert_eq!(config.limits.query_memory_bytes, 8 << 20);
    assert_eq!(parse_bytes("1000"), Ok(1000));
    assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
    assert!(parse_bytes("2G").is_err());
    for bad in ["1Mi", "lots"] {
        let err = layered(None, &["--memory-budget", bad]).unwrap_err();
        assert!(err.to_string().contains("storage.memory_budget"), "{err}");
    }
}

#[test]
fn tokens_are_refused_as_flags() {
    for flag in ["--write-tokens", "--read-tokens"] {
        let err = layered(None, &[flag, "secret"]).unwrap_err();
        assert_eq!(err.reason(), "config_arguments", "{err}");
    }
}

#[test]
fn the_token_variables_rank_above_the_file() {
    let mut settings = parse_file_settings(
        "version = 1\n[auth]\nwrite_tokens = [\"file\"]\nread_tokens = [\"r\"]\n",
        Path::new("k.toml"),
    )
    .unwrap();
    settings
        .auth
        .overlay_environment(|name| (name == "KILN_WRITE_TOKENS").then(|| "env1, env2".to_owned()));
    let config = Config::resolve(&settings, None).unwrap();
    assert_eq!(config.write_tokens, ["env1", "env2"]);
    assert_eq!(config.read_tokens, ["r"]);
}

#[test]
fn token_files_are_read_once_and_must_hold_a_token() {
    let files = |path: &Path| match path.to_str() {
        Some("/run/write") => Ok("w1\nw2\n".to_owned()),
        Some("/run/empty") => Ok("\n".to_owned()),
        _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
    };
    let mut settings = StoreSettings::default();
    settings.auth.write_tokens_file = Some(PathBuf::from("/run/write"));
    read_token_files(&mut settings.auth, files).unwrap();
    let config = Config::resolve(&settings, None).unwrap();
    assert_eq!(config.write_tokens, ["w1", "w2"]);
    assert!(config.read_tokens.is_empty());

    let mut empty = StoreSettings::default();
    empty.auth.read_tokens_file = Some(PathBuf::from("/run/empty"));
    let err = read_token_files(&mut empty.auth, files).unwrap_err();
    assert!(err.to_string().contains("auth.read_tokens_file"), "{err}");

    let mut missing = StoreSettings::default();
    missing.auth.read_tokens_file = Some(PathBuf::from("/run/missing"));
    let err = read_token_files(&mut missing.auth, files).unwrap_err();
    assert_eq!(err.reason(), "config_read");

    let mut both = StoreSettings::default();
    both.auth.write_tokens = Some(vec!["w".into()]);
    both.auth.write_tokens_file = Some(PathBuf::from("/run/write"));
    let err = read_token_files(&mut both.auth, files).unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
}

#[test]
fn namespace_tokens_bind_a_token_to_its_namespaces() {
    let mut settings = StoreSettings::default();
    settings.auth.write_tokens = Some(vec!["agents".into()]);
    settings.auth.overlay_environment(|name| {
        (name == "KILN_NAMESPACE_WRITE_TOKENS")
            .then(|| "shop:t1, checkout:t1,\npayments:t2:with-colon".to_owned())
    });
    let config = Config::resolve(&settings, None).unwrap();
    assert_eq!(config.write_tokens, ["agents"]);
    assert_eq!(
        config.namespace_write_tokens,
        [
            NamespaceToken {
                token: "t1".into(),
                namespaces: vec!["checkout".into(), "shop".into()],
            },
            NamespaceToken {
                token: "t2:with-colon".into(),
                namespaces: vec!["payments".into()],
            },
        ]
    );

    for (entries, why) in [
        ("no-colon-here", "is not `namespace:token`"),
        ("Shop:t", "Kubernetes namespace name"),
        ("-shop:t", "Kubernetes namespace name"),
        ("shop:", "holds no token"),
        ("shop:agents", "also in the write tokens"),
    ] {
        let mut bad = settings.clone();
        bad.auth.namespace_write_tokens = Some(vec![entries.to_owned()]);
        let err = Config::resolve(&bad, None).unwrap_err().to_string();
        assert!(err.contains(why), "{entries}: {err}");
        assert!(err.contains("auth.namespace_write_tokens"), "{err}");
        // An entry is never echoed: it holds a token.
        assert!(!err.contains(entries), "{err}");
    }
}

#[test]
fn the_peer_connect_timeout_is_short_by_default_and_never_zero() {
    let default = layered(None, &[]).unwrap();
    assert_eq!(default.peer_connect_timeout, Duration::from_secs(2));
    let file = "version = 1\n[storage]\npeer_connect_timeout = \"500ms\"\n";
    let config = layered(Some(file), &[]).unwrap();
    assert_eq!(config.peer_connect_timeout, Duration::from_millis(500));
    let config = layered(Some(file), &["--peer-connect-timeout", "3s"]).unwrap();
    assert_eq!(config.peer_connect_timeout, Duration::from_secs(3));
    for bad in ["0s", "soon"] {
        let err = layered(None, &["--peer-connect-timeout", bad]).unwrap_err();
        assert!(
            err.to_string().contains("storage.peer_connect_timeout"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn peers_are_every_other_replica_and_bad_entries_name_the_setting() {
    let list = "kiln-0=http://kiln-0.kiln-peers.ns.svc:7470,kiln-1=http://10.0.0.7:7470/";
    let config = layered(None, &["--replica", "kiln-0", "--peers", list]).unwrap();
    assert_eq!(
        config.peers,
        vec![PeerAddress {
            name: "kiln-1".into(),
            authority: "10.0.0.7:7470".into(),
        }]
    );
    assert!(layered(None, &[]).unwrap().peers.is_empty());
    for bad in [
        "kiln-1",
        "kiln-1=https://a:1",
        "kiln-1=http://a",
        "kiln-1=http://a:1/path",
        "kiln-1=http://user@a:1",
        "=http://a:1",
        "a=http://a:1,a=http://b:1",
    ] {
        let err = layered(None, &["--peers", bad]).unwrap_err();
        assert!(err.to_string().contains("storage.peers"), "{bad}: {err}");
    }
}
