//! `kiln`: query a Kiln store from the terminal, and start Kiln on one
//! machine with `kiln up`.
// Printing results is this binary's job.
#![allow(clippy::print_stdout)]

mod args;
mod client;
mod progress;
mod render;
mod up;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;

use crate::args::{
    Cli, Command, DebuginfoCommand, DebuginfoUploadArgs, DiffArgs, Format, LabelsArgs, QueryArgs,
    RangeArgs, SeriesArgs,
};
use crate::client::ClientError;
use crate::client::StoreClient;
use crate::progress::Progress;
use kiln_contract::query_json::{
    DebugInfoUploaded, DiffResponse, FlameGraphResponse, LabelNames, LabelValues,
    PROFILE_TYPE_HEADER, ProfileTypes, SeriesList, TopResponse,
};

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
    fn label_names_are_escaped_as_one_path_segment() {
        assert_eq!(percent_encode_segment("service.name"), "service.name");
        assert_eq!(percent_encode_segment("a/b c"), "a%2Fb%20c");
    }
}
