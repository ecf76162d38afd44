//! `kiln`: query a Kiln store from the terminal, and start Kiln on one
//! machine with `kiln up`.
// Printing results is this binary's job.
#![allow(clippy::print_stdout)]

mod client;
mod progress;
mod render;
mod up;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::ClientError;
use crate::client::StoreClient;
use crate::progress::Progress;
use kiln_contract::query_json::{
    DebugInfoUploaded, DiffResponse, FlameGraphResponse, LabelNames, LabelValues,
    PROFILE_TYPE_HEADER, ProfileTypes, SeriesList, TopResponse,
};

/// Query a Kiln profile store, render flame graphs, or start Kiln locally.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, propagate_version = true)]
struct Cli {
    /// Base URL of the store.
    #[arg(
        long,
        global = true,
        env = "KILN_STORE",
        default_value = kiln_contract::endpoints::LOCAL_STORE_URL
    )]
    store: String,
    /// Bearer token, when the store requires one for reads (or, for
    /// `kiln debuginfo upload`, a write token for any namespace).
    #[arg(long, global = true, env = "KILN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Give up on a request after this long (e.g. 30s, 5m).
    #[arg(long, global = true, env = "KILN_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    timeout: Duration,
    /// Exit with status 4 when the store marked an answer partial
    /// (`Kiln-Partial`: a replica or block it could not read), after
    /// writing the answer; without it, only a warning on stderr says so.
    #[arg(long, global = true, env = "KILN_FAIL_ON_PARTIAL")]
    fail_on_partial: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Merge a selection's profiles: a top table, or a file (SVG flame
    /// graph, pprof, JSON, folded stacks) chosen by --output's extension.
    Query(QueryArgs),
    /// List the stored profile types.
    Types(TypesArgs),
    /// List label names, or with NAME the values of one label.
    Labels(LabelsArgs),
    /// List the series (label sets) a selector matches.
    Series(SeriesArgs),
    /// Compare two selections: the functions that changed most, or a
    /// differential flame graph with --output diff.svg.
    Diff(DiffArgs),
    /// Start Kiln on this machine: kiln-store on a local data directory plus
    /// kiln-agent --all (and any --scrape pprof endpoints), until Ctrl-C.
    Up(UpArgs),
    /// Debug info for the store's symbolizer, which names frames that
    /// arrived as build id and address (stripped binaries, the
    /// OpenTelemetry eBPF profiler, Parca Agent).
    #[command(subcommand)]
    Debuginfo(DebuginfoCommand),
}

#[derive(Debug, Subcommand)]
enum DebuginfoCommand {
    /// Upload an ELF file with symbols or DWARF (an unstripped binary, or
    /// the debug file `objcopy --only-keep-debug` makes), keyed by the
    /// build id it records: frames of that build id are named in every
    /// later query, of earlier data too. Needs a write token for any
    /// namespace (--token / KILN_TOKEN) when the store requires tokens.
    Upload(DebuginfoUploadArgs),
}

#[derive(Debug, Args)]
struct DebuginfoUploadArgs {
    /// The ELF file.
    file: PathBuf,
}

#[derive(Debug, Args)]
struct RangeArgs {
    /// Start of the range: RFC 3339, unix seconds/ms/ns, or now-1h style.
    #[arg(long, env = "KILN_FROM", default_value = "now-1h")]
    from: String,
    /// End of the range, in the same forms.
    #[arg(long, env = "KILN_TO", default_value = "now")]
    to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// An aligned text table.
    Table,
    /// The store's JSON answer.
    Json,
    /// An SVG flame graph (inferno).
    Svg,
    /// The merged profile as gzipped pprof.
    Pprof,
    /// Folded stacks, one `a;b;c value` line per stack.
    Folded,
}

#[derive(Debug, Args)]
struct QueryArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// Write to this file; the format follows the extension (.svg, .pb.gz,
    /// .json, .folded/.txt) unless --format says otherwise.
    #[arg(long, short, env = "KILN_OUTPUT")]
    output: Option<PathBuf>,
    /// Output format (default: from --output's extension, else table).
    #[arg(long, value_enum, env = "KILN_FORMAT")]
    format: Option<Format>,
    /// Rows of the top table.
    #[arg(long, env = "KILN_LIMIT", default_value_t = 25)]
    limit: usize,
    /// Largest number of flame graph nodes in JSON output (SVG, folded and
    /// pprof are never trimmed).
    #[arg(long, env = "KILN_MAX_NODES", default_value_t = 65536)]
    max_nodes: usize,
    /// Group by these labels, outermost first: each group becomes a root
    /// frame `label=value` (e.g. --group-by namespace,pod).
    #[arg(long, env = "KILN_GROUP_BY", value_delimiter = ',')]
    group_by: Vec<String>,
    /// Only the samples that ran in these tracing spans (span ids, 16 hex
    /// digits each, e.g. --span-id 9a517183f26a089d).
    #[arg(long, env = "KILN_SPAN_ID", value_delimiter = ',')]
    span_id: Vec<String>,
    /// The selector, e.g. 'process_cpu{pod="checkout-1"}'.
    selector: String,
}

#[derive(Debug, Args)]
struct TypesArgs {
    #[command(flatten)]
    range: RangeArgs,
}

#[derive(Debug, Args)]
struct LabelsArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// Only series matching this selector.
    #[arg(long, env = "KILN_QUERY")]
    query: Option<String>,
    /// Print JSON instead of one name per line.
    #[arg(long, env = "KILN_JSON")]
    json: bool,
    /// Show this label's values instead of the label names.
    name: Option<String>,
}

#[derive(Debug, Args)]
struct SeriesArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// Print JSON instead of one series per line.
    #[arg(long, env = "KILN_JSON")]
    json: bool,
    /// The selector; all series when absent.
    selector: Option<String>,
}

#[derive(Debug, Args)]
struct DiffArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// Start of the compared range (default: --from).
    #[arg(long, env = "KILN_COMPARE_FROM")]
    compare_from: Option<String>,
    /// End of the compared range (default: --to).
    #[arg(long, env = "KILN_COMPARE_TO")]
    compare_to: Option<String>,
    /// Write to this file: .svg (differential flame graph) or .json.
    #[arg(long, short, env = "KILN_OUTPUT")]
    output: Option<PathBuf>,
    /// Rows of the change table.
    #[arg(long, env = "KILN_LIMIT", default_value_t = 25)]
    limit: usize,
    /// Largest number of nodes in the diff tree.
    #[arg(long, env = "KILN_MAX_NODES", default_value_t = 65536)]
    max_nodes: usize,
    /// The base selection.
    base: String,
    /// The compared selection (default: the base, over the compared range).
    compare: Option<String>,
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Address for the store (UI, API and ingest).
    #[arg(long, env = "KILN_LISTEN", default_value = kiln_contract::endpoints::LOCAL_STORE_ADDR)]
    listen: String,
    /// Where the store keeps its data (default: ~/.local/share/kiln).
    #[arg(long, env = "KILN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Run only the store, without the host agent.
    #[arg(long, env = "KILN_NO_AGENT")]
    no_agent: bool,
    /// Also scrape the pprof endpoints under these base URLs with the agent
    /// (comma-separated, e.g. http://127.0.0.1:6060/debug/pprof): heap,
    /// allocations, goroutines, mutex and block profiles. Without root the
    /// agent only scrapes.
    #[arg(long, env = "KILN_SCRAPE", value_delimiter = ',')]
    scrape: Vec<String>,
    /// How long to wait for the store to become ready (recovery can take a while).
    #[arg(long, env = "KILN_READY_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    ready_timeout: Duration,
}

/// A duration in Kiln's one grammar (docs/durations.md).
fn parse_duration(text: &str) -> Result<Duration, String> {
    kiln_contract::duration::parse_duration(text).map_err(|err| err.to_string())
}

/// The exit status of a command whose answer was partial, with
/// `--fail-on-partial`.
const PARTIAL_EXIT: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let fail_on_partial = cli.fail_on_partial;
    match run(cli) {
        Ok(partial) if partial.is_empty() => ExitCode::SUCCESS,
        Ok(partial) => {
            for value in &partial {
                eprintln!(
                    "kiln: warning: the store's answer is partial (Kiln-Partial: {value}): \
                     it lacks data the store could not read (docs/api.md, \"Partial answers\")"
                );
            }
            if fail_on_partial {
                ExitCode::from(PARTIAL_EXIT)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(err) => {
            eprintln!("kiln: {err:#}");
            // Scripts can tell "fix your query" from "the store is down".
            match err.downcast_ref::<ClientError>().map(ClientError::reason) {
                Some("rejected") => ExitCode::from(2),
                Some("unreachable") => ExitCode::from(3),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Runs the command; returns what the store said its answers lacked
/// (`Kiln-Partial` values), empty when they were whole.
fn run(cli: Cli) -> anyhow::Result<Vec<String>> {
    if let Command::Up(args) = &cli.command {
        up::run(&up::UpOptions {
            listen: args.listen.clone(),
            data_dir: args.data_dir.clone().unwrap_or_else(up::default_data_dir),
            agent: !args.no_agent,
            scrape: args.scrape.clone(),
            ready_timeout: args.ready_timeout,
        })?;
        return Ok(Vec::new());
    }
    let client = StoreClient::new(&cli.store, cli.token.clone(), cli.timeout)?;
    run_against(&client, cli.command)?;
    Ok(client.partial_answers())
}

fn run_against(client: &StoreClient, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Query(args) => query(client, &args),
        Command::Types(args) => {
            let mut params = Vec::new();
            range_params(&args.range, &mut params);
            let types: ProfileTypes = client.get_json("api/v1/profile-types", &params)?;
            for entry in types.profile_types {
                println!("{}", entry.id);
            }
            Ok(())
        }
        Command::Labels(args) => labels(client, &args),
        Command::Series(args) => series(client, &args),
        Command::Diff(args) => diff(client, &args),
        Command::Debuginfo(DebuginfoCommand::Upload(args)) => upload_debuginfo(client, &args),
        Command::Up(_) => Ok(()),
    }
}

fn upload_debuginfo(client: &StoreClient, args: &DebuginfoUploadArgs) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let answer = client.post_bytes("api/v1/debuginfo", &bytes)?;
    let uploaded: DebugInfoUploaded =
        serde_json::from_slice(&answer).context("reading the store's answer")?;
    println!(
        "uploaded {}: build id {}, {} ({} bytes, {} symbols, DWARF {})",
        args.file.display(),
        uploaded.build_id,
        uploaded.kind,
        uploaded.bytes,
        uploaded.symbols,
        if uploaded.dwarf { "yes" } else { "no" }
    );
    Ok(())
}

/// The format implied by a file name, if any.
fn format_from_path(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    let format = if name.ends_with(".svg") {
        Format::Svg
    } else if name.ends_with(".json") {
        Format::Json
    } else if name.ends_with(".pb.gz")
        || name.ends_with(".pb")
        || name.ends_with(".pprof")
        || name.ends_with(".gz")
    {
        Format::Pprof
    } else if name.ends_with(".folded") || name.ends_with(".txt") {
        Format::Folded
    } else {
        return None;
    };
    Some(format)
}

/// Writes `bytes` to `output`, or stdout.
fn emit(output: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match output {
        Some(path) => {
            std::fs::write(path, bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("kiln: wrote {} ({} bytes)", path.display(), bytes.len());
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).context("cannot write to stdout")?;
            out.flush().context("cannot write to stdout")?;
        }
    }
    Ok(())
}

fn range_params<'a>(range: &'a RangeArgs, params: &mut Vec<(&'static str, &'a str)>) {
    params.push(("from", &range.from));
    params.push(("to", &range.to));
}

fn query(client: &StoreClient, args: &QueryArgs) -> anyhow::Result<()> {
    let format = match (args.format, args.output.as_deref()) {
        (Some(format), _) => format,
        (None, None) => Format::Table,
        (None, Some(path)) => format_from_path(path).with_context(|| {
            format!(
                "cannot tell the format from {}; pass --format svg|pprof|json|folded|table",
                path.display()
            )
        })?,
    };
    let mut params = vec![("query", args.selector.as_str())];
    range_params(&args.range, &mut params);
    let group_by = args.group_by.join(",");
    if !group_by.is_empty() {
        params.push(("group_by", &group_by));
    }
    let span_ids = args.span_id.join(",");
    if !span_ids.is_empty() {
        params.push(("span_id", &span_ids));
    }
    let output = args.output.as_deref();
    match format {
        Format::Table => {
            let limit = args.limit.to_string();
            params.push(("limit", &limit));
            let top: TopResponse = {
                let _progress = Progress::start("merging profiles");
                client.get_json("api/v1/top", &params)?
            };
            emit(output, render::top_table(&top, args.limit).as_bytes())
        }
        Format::Pprof => {
            if output.is_none() && std::io::stdout().is_terminal() {
                bail!("pprof is binary; pass --output profile.pb.gz or redirect stdout");
            }
            let bytes = {
                let _progress = Progress::start("merging profiles into pprof");
                client.get_bytes("api/v1/pprof", &params)?
            };
            emit(output, &bytes)
        }
        Format::Json => {
            let max_nodes = args.max_nodes.to_string();
            params.push(("max_nodes", &max_nodes));
            let graph: FlameGraphResponse = {
                let _progress = Progress::start("merging profiles into a flame graph");
                client.get_json("api/v1/flamegraph", &params)?
            };
            let bytes = serde_json::to_vec_pretty(&graph).context("cannot encode JSON")?;
            emit(output, &bytes)
        }
        Format::Svg | Format::Folded => {
            // The store's untrimmed folded stacks, never the flame graph
            // tree, whose trimmed siblings are merged into `(other)`.
            let (folded, profile_type) = {
                let _progress = Progress::start("merging profiles into folded stacks");
                client.get_with_header("api/v1/folded", &params, Some(PROFILE_TYPE_HEADER))?
            };
            if format == Format::Folded {
                return emit(output, &folded);
            }
            let folded =
                String::from_utf8(folded).context("the store's folded stacks are not UTF-8")?;
            let lines: Vec<&str> = folded.lines().collect();
            // `name:sample_type:sample_unit:...`; the selector may abbreviate it.
            let unit = profile_type
                .as_deref()
                .and_then(|id| id.split(':').nth(2))
                .unwrap_or("")
                .to_owned();
            let _progress = Progress::start("rendering the flame graph");
            let title = format!(
                "{}  {} .. {}",
                args.selector, args.range.from, args.range.to
            );
            let svg = render::flamegraph_svg(&lines, &title, &unit)
                .map_err(|e| anyhow::anyhow!("cannot render the flame graph: {e}"))?;
            emit(output, &svg)
        }
    }
}

fn labels(client: &StoreClient, args: &LabelsArgs) -> anyhow::Result<()> {
    let mut params = Vec::new();
    if let Some(query) = &args.query {
        params.push(("query", query.as_str()));
    }
    range_params(&args.range, &mut params);
    let items = match &args.name {
        None => {
            client
                .get_json::<LabelNames>("api/v1/labels", &params)?
                .names
        }
        Some(name) => {
            let path = format!("api/v1/labels/{}/values", percent_encode_segment(name));
            client.get_json::<LabelValues>(&path, &params)?.values
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&items).context("cannot encode JSON")?
        );
    } else {
        for item in items {
            println!("{item}");
        }
    }
    Ok(())
}

/// Escapes a label name for use as one URL path segment.
fn percent_encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn series(client: &StoreClient, args: &SeriesArgs) -> anyhow::Result<()> {
    let mut params = Vec::new();
    if let Some(selector) = &args.selector {
        params.push(("query", selector.as_str()));
    }
    range_params(&args.range, &mut params);
    let series: SeriesList = client.get_json("api/v1/series", &params)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&series.series).context("cannot encode JSON")?
        );
        return Ok(());
    }
    for labels in &series.series {
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
            .collect();
        println!("{{{}}}", body.join(", "));
    }
    eprintln!("kiln: {} series", series.series.len());
    Ok(())
}

fn diff(client: &StoreClient, args: &DiffArgs) -> anyhow::Result<()> {
    let compare = args.compare.as_deref().unwrap_or(&args.base);
    let compare_from = args.compare_from.as_deref().unwrap_or(&args.range.from);
    let compare_to = args.compare_to.as_deref().unwrap_or(&args.range.to);
    let max_nodes = args.max_nodes.to_string();
    let params = [
        ("left_query", args.base.as_str()),
        ("left_from", args.range.from.as_str()),
        ("left_to", args.range.to.as_str()),
        ("right_query", compare),
        ("right_from", compare_from),
        ("right_to", compare_to),
        ("max_nodes", max_nodes.as_str()),
    ];
    let format = match args.output.as_deref() {
        None => Format::Table,
        Some(path) => match format_from_path(path) {
            Some(f @ (Format::Svg | Format::Json | Format::Folded)) => f,
            _ => bail!(
                "diff writes .svg, .json or .folded files, not {}",
                path.display()
            ),
        },
    };
    if matches!(format, Format::Folded | Format::Svg) {
        // Both sides' untrimmed stacks, never the trimmed diff tree.
        let side = |query: &str, from: &str, to: &str| {
            client.get_with_header(
                "api/v1/folded",
                &[("query", query), ("from", from), ("to", to)],
                Some(PROFILE_TYPE_HEADER),
            )
        };
        let ((base, profile_type), (compared, _)) = {
            let _progress = Progress::start("merging both selections into folded stacks");
            (
                side(&args.base, &args.range.from, &args.range.to)?,
                side(compare, compare_from, compare_to)?,
            )
        };
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).context("the store's folded stacks are not UTF-8")
        };
        let lines = render::diff_folded_lines(&text(base)?, &text(compared)?)
            .map_err(|e| anyhow::anyhow!(e))?;
        let bytes = if format == Format::Folded {
            let mut text = lines.join("\n");
            text.push('\n');
            text.into_bytes()
        } else {
            let unit = profile_type
                .as_deref()
                .and_then(|id| id.split(':').nth(2))
                .unwrap_or("");
            let title = format!("{} → {}", args.base, compare);
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            render::flamegraph_svg(&lines, &title, unit)
                .map_err(|e| anyhow::anyhow!("cannot render the flame graph: {e}"))?
        };
        return emit(args.output.as_deref(), &bytes);
    }
    let answer: DiffResponse = {
        let _progress = Progress::start("merging both selections");
        client.get_json("api/v1/diff", &params)?
    };
    let bytes = match format {
        Format::Json => serde_json::to_vec_pretty(&answer).context("cannot encode JSON")?,
        _ => {
            let mut text = format!(
                "{}  base total {}  compared total {}\n",
                answer.profile_type,
                render::format_value(answer.left_total, &answer.unit),
                render::format_value(answer.right_total, &answer.unit)
            );
            text.push_str(&render::diff_table(
                &render::diff_rows(&answer.diff),
                args.limit,
            ));
            text.into_bytes()
        }
    };
    emit(args.output.as_deref(), &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn output_extensions_choose_the_format() {
        assert_eq!(format_from_path(Path::new("flame.SVG")), Some(Format::Svg));
        assert_eq!(
            format_from_path(Path::new("/tmp/profile.pb.gz")),
            Some(Format::Pprof)
        );
        assert_eq!(format_from_path(Path::new("x.json")), Some(Format::Json));
        assert_eq!(
            format_from_path(Path::new("stacks.folded")),
            Some(Format::Folded)
        );
        assert_eq!(format_from_path(Path::new("profile")), None);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn label_names_are_escaped_as_one_path_segment() {
        assert_eq!(percent_encode_segment("service.name"), "service.name");
        assert_eq!(percent_encode_segment("a/b c"), "a%2Fb%20c");
    }
}
