//! `kiln up`: Kiln on one machine. Starts `kiln-store` on a local data
//! directory and `kiln-agent --all` for the host (plus `--scrape` pprof
//! endpoints; scraping alone without root), its `/metrics` on a free port,
//! prints the UI address, and stops both on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::client::StoreClient;
use crate::progress::Progress;

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP_REQUESTED.store(true, Ordering::SeqCst);
}

fn install_stop_handlers() {
    let handler = request_stop as extern "C" fn(libc::c_int);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `request_stop` is an `extern "C"` function that only stores
        // to a static atomic, which is async-signal-safe; `signal` installs
        // it for a valid signal number and has no other preconditions.
        unsafe {
            libc::signal(signal, handler as libc::sighandler_t);
        }
    }
}

/// What `kiln up` runs.
#[derive(Debug)]
pub struct UpOptions {
    /// Address the store listens on.
    pub listen: String,
    /// The store's data directory.
    pub data_dir: PathBuf,
    /// Start the agent too.
    pub agent: bool,
    /// pprof base URLs the agent scrapes.
    pub scrape: Vec<String>,
    /// How long to wait for the store to become ready.
    pub ready_timeout: Duration,
}

/// Finds a sibling binary of the running `kiln`, else one on `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    })
}

/// The default data directory: `$XDG_DATA_HOME/kiln`, `~/.local/share/kiln`,
/// or `./kiln-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("kiln");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join(".local/share/kiln");
    }
    PathBuf::from("kiln-data")
}

fn signal_child(child: &Child, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: `kill` has no memory-safety preconditions; `pid` is our
        // own child, which we have not reaped yet, so the id is still ours.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Asks `child` to stop (SIGTERM), then kills it after `grace`.
fn stop_child(name: &str, child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    signal_child(child, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "kiln: {name} did not stop within {}s; killing it",
        grace.as_secs()
    );
    let _ = child.kill();
    child.wait().ok()
}

fn spawn(binary: &Path, args: &[String]) -> anyhow::Result<Child> {
    Command::new(binary)
        .args(args)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))
}

/// Runs Kiln until Ctrl-C. Returns an error if the store fails.
pub fn run(options: &UpOptions) -> anyhow::Result<()> {
    let store_binary = find_binary("kiln-store").context(
        "kiln-store was not found next to kiln or on PATH; build it with `cargo build --release -p kiln-store`",
    )?;
    std::fs::create_dir_all(&options.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}",
            options.data_dir.display()
        )
    })?;
    install_stop_handlers();
    let url = format!("http://{}", options.listen);
    eprintln!(
        "kiln: starting {} (data in {})",
        store_binary.display(),
        options.data_dir.display()
    );
    let mut store = spawn(
        &store_binary,
        &[
            "--listen".to_owned(),
            options.listen.clone(),
            "--data-dir".to_owned(),
            options.data_dir.display().to_string(),
        ],
    )?;
    if let Err(err) = wait_ready(&url, &mut store, options.ready_timeout) {
        stop_child("kiln-store", &mut store, Duration::from_secs(10));
        return Err(err);
    }
    let mut agent = None;
    if options.agent {
        match find_binary("kiln-agent") {
            None => eprintln!(
                "kiln: kiln-agent was not found next to kiln or on PATH; running the store alone"
            ),
            Some(binary) => {
                let args = agent_args(&options.scrape, &url, is_root(), free_metrics_addr());
                eprintln!("kiln: starting {} {}", binary.display(), args.join(" "));
                agent = Some(spawn(&binary, &args)?);
            }
        }
    }
    println!(
        "\nKiln is running.\n  UI and API:  {url}/\n  Query:       kiln query --store {url} 'process_cpu:cpu{{}}'\nPress Ctrl-C to stop.\n"
    );
    let result = supervise(&mut store, &mut agent);
    if let Some(child) = agent.as_mut() {
        stop_child("kiln-agent", child, Duration::from_secs(15));
    }
    let store_status = stop_child("kiln-store", &mut store, Duration::from_secs(30));
    eprintln!("kiln: stopped");
    result?;
    match store_status {
        Some(status) if !status.success() && !STOP_REQUESTED.load(Ordering::SeqCst) => {
            bail!("kiln-store exited with {status}")
        }
        _ => Ok(()),
    }
}

/// The agent's flags: every process of the host when root (BPF needs it),
/// the `--scrape` endpoints in any case (scraping alone needs no
/// privileges), and its `/metrics` on `metrics`.
fn agent_args(scrape: &[String], store_url: &str, root: bool, metrics: String) -> Vec<String> {
    let mut args = Vec::new();
    if root || scrape.is_empty() {
        args.push("--all".to_owned());
    }
    if !scrape.is_empty() {
        args.extend(["--scrape".to_owned(), scrape.join(",")]);
    }
    args.extend([
        "--store".to_owned(),
        store_url.to_owned(),
        "--metrics-addr".to_owned(),
        metrics,
    ]);
    args
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A loopback address for the agent's `/metrics` that is free now: the
/// agent's default (7471) when nothing holds it, else one the kernel picks,
/// so a second `kiln up`, or a store on 7471, does not collide with it.
fn free_metrics_addr() -> String {
    let default = "127.0.0.1:7471";
    if std::net::TcpListener::bind(default).is_ok() {
        return default.to_owned();
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_or_else(|_| "off".to_owned(), |address| address.to_string())
}

fn wait_ready(url: &str, store: &mut Child, timeout: Duration) -> anyhow::Result<()> {
    let client = StoreClient::new(url, None, Duration::from_secs(2))?;
    let _progress = Progress::start("waiting for kiln-store to recover and become ready");
    let deadline = Instant::now() + timeout;
    loop {
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            bail!("interrupted while the store was starting");
        }
        if let Some(status) = store.try_wait().context("cannot check on kiln-store")? {
            bail!("kiln-store exited during start-up with {status}; see its log above");
        }
        if client.get_bytes("readyz", &[]).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "kiln-store did not become ready at {url} within {}s",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn supervise(store: &mut Child, agent: &mut Option<Child>) -> anyhow::Result<()> {
    loop {
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(status) = store.try_wait().context("cannot check on kiln-store")? {
            bail!("kiln-store exited unexpectedly with {status}");
        }
        if let Some(child) = agent.as_mut()
            && let Some(status) = child.try_wait().context("cannot check on kiln-agent")?
        {
            eprintln!(
                "kiln: kiln-agent exited with {status} (it needs root and BPF); the store keeps running"
            );
            *agent = None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_scrapes_alone_without_root_and_beside_cpu_with_it() {
        let store = "http://127.0.0.1:7470";
        let metrics = || "127.0.0.1:7471".to_owned();
        assert_eq!(
            agent_args(&[], store, false, metrics()),
            [
                "--all",
                "--store",
                store,
                "--metrics-addr",
                "127.0.0.1:7471"
            ]
        );
        let urls = [
            "http://a:1/debug/pprof".to_owned(),
            "http://b:2/x".to_owned(),
        ];
        assert_eq!(
            agent_args(&urls, store, false, metrics()),
            [
                "--scrape",
                "http://a:1/debug/pprof,http://b:2/x",
                "--store",
                store,
                "--metrics-addr",
                "127.0.0.1:7471"
            ]
        );
        assert_eq!(agent_args(&urls, store, true, metrics())[0], "--all");
    }

    #[test]
    fn the_metrics_address_moves_off_a_taken_port() {
        let held = std::net::TcpListener::bind("127.0.0.1:7471");
        let address = free_metrics_addr();
        if held.is_ok() {
            assert_ne!(address, "127.0.0.1:7471");
        }
        assert!(address.starts_with("127.0.0.1:"), "{address}");
    }
}
