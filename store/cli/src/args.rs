//! The command line: clap's derive of every subcommand and flag (each
//! with its `KILN_*` variable), apart from what the commands do.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Query a Kiln profile store, render flame graphs, or start Kiln locally.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Base URL of the store.
    #[arg(
        long,
        global = true,
        env = "KILN_STORE",
        default_value = kiln_contract::endpoints::LOCAL_STORE_URL
    )]
    pub(crate) store: String,
    /// Bearer token, when the store requires one for reads (or, for
    /// `kiln debuginfo upload`, a write token for any namespace).
    #[arg(long, global = true, env = "KILN_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Give up on a request after this long (e.g. 30s, 5m).
    #[arg(long, global = true, env = "KILN_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Exit with status 4 when the store marked an answer partial
    /// (`Kiln-Partial`: a replica or block it could not read), after
    /// writing the answer; without it, only a warning on stderr says so.
    #[arg(long, global = true, env = "KILN_FAIL_ON_PARTIAL")]
    pub(crate) fail_on_partial: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
pub(crate) enum DebuginfoCommand {
    /// Upload an ELF file with symbols or DWARF (an unstripped binary, or
    /// the debug file `objcopy --only-keep-debug` makes), keyed by the
    /// build id it records: frames of that build id are named in every
    /// later query, of earlier data too. Needs a write token for any
    /// namespace (--token / KILN_TOKEN) when the store requires tokens.
    Upload(DebuginfoUploadArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DebuginfoUploadArgs {
    /// The ELF file.
    pub(crate) file: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct RangeArgs {
    /// Start of the range: RFC 3339, unix seconds/ms/ns, or now-1h style.
    #[arg(long, env = "KILN_FROM", default_value = "now-1h")]
    pub(crate) from: String,
    /// End of the range, in the same forms.
    #[arg(long, env = "KILN_TO", default_value = "now")]
    pub(crate) to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
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
pub(crate) struct QueryArgs {
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Write to this file; the format follows the extension (.svg, .pb.gz,
    /// .json, .folded/.txt) unless --format says otherwise.
    #[arg(long, short, env = "KILN_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// Output format (default: from --output's extension, else table).
    #[arg(long, value_enum, env = "KILN_FORMAT")]
    pub(crate) format: Option<Format>,
    /// Rows of the top table.
    #[arg(long, env = "KILN_LIMIT", default_value_t = 25)]
    pub(crate) limit: usize,
    /// Largest number of flame graph nodes in JSON output (SVG, folded and
    /// pprof are never trimmed).
    #[arg(long, env = "KILN_MAX_NODES", default_value_t = 65536)]
    pub(crate) max_nodes: usize,
    /// Group by these labels, outermost first: each group becomes a root
    /// frame `label=value` (e.g. --group-by namespace,pod).
    #[arg(long, env = "KILN_GROUP_BY", value_delimiter = ',')]
    pub(crate) group_by: Vec<String>,
    /// Only the samples that ran in these tracing spans (span ids, 16 hex
    /// digits each, e.g. --span-id 9a517183f26a089d).
    #[arg(long, env = "KILN_SPAN_ID", value_delimiter = ',')]
    pub(crate) span_id: Vec<String>,
    /// The selector, e.g. 'process_cpu{pod="checkout-1"}'.
    pub(crate) selector: String,
}

#[derive(Debug, Args)]
pub(crate) struct TypesArgs {
    #[command(flatten)]
    pub(crate) range: RangeArgs,
}

#[derive(Debug, Args)]
pub(crate) struct LabelsArgs {
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Only series matching this selector.
    #[arg(long, env = "KILN_QUERY")]
    pub(crate) query: Option<String>,
    /// Print JSON instead of one name per line.
    #[arg(long, env = "KILN_JSON")]
    pub(crate) json: bool,
    /// Show this label's values instead of the label names.
    pub(crate) name: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SeriesArgs {
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Print JSON instead of one series per line.
    #[arg(long, env = "KILN_JSON")]
    pub(crate) json: bool,
    /// The selector; all series when absent.
    pub(crate) selector: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Start of the compared range (default: --from).
    #[arg(long, env = "KILN_COMPARE_FROM")]
    pub(crate) compare_from: Option<String>,
    /// End of the compared range (default: --to).
    #[arg(long, env = "KILN_COMPARE_TO")]
    pub(crate) compare_to: Option<String>,
    /// Write to this file: .svg (differential flame graph) or .json.
    #[arg(long, short, env = "KILN_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// Rows of the change table.
    #[arg(long, env = "KILN_LIMIT", default_value_t = 25)]
    pub(crate) limit: usize,
    /// Largest number of nodes in the diff tree.
    #[arg(long, env = "KILN_MAX_NODES", default_value_t = 65536)]
    pub(crate) max_nodes: usize,
    /// The base selection.
    pub(crate) base: String,
    /// The compared selection (default: the base, over the compared range).
    pub(crate) compare: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Address for the store (UI, API and ingest).
    #[arg(long, env = "KILN_LISTEN", default_value = kiln_contract::endpoints::LOCAL_STORE_ADDR)]
    pub(crate) listen: String,
    /// Where the store keeps its data (default: ~/.local/share/kiln).
    #[arg(long, env = "KILN_DATA_DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Run only the store, without the host agent.
    #[arg(long, env = "KILN_NO_AGENT")]
    pub(crate) no_agent: bool,
    /// Also scrape the pprof endpoints under these base URLs with the agent
    /// (comma-separated, e.g. http://127.0.0.1:6060/debug/pprof): heap,
    /// allocations, goroutines, mutex and block profiles. Without root the
    /// agent only scrapes.
    #[arg(long, env = "KILN_SCRAPE", value_delimiter = ',')]
    pub(crate) scrape: Vec<String>,
    /// How long to wait for the store to become ready (recovery can take a while).
    #[arg(long, env = "KILN_READY_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub(crate) ready_timeout: Duration,
}

/// A duration in Kiln's one grammar (docs/durations.md).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    kiln_contract::duration::parse_duration(text).map_err(|err| err.to_string())
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
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
