//! The AFL++ entry point: `cargo afl fuzz ... target/release/kiln-fuzz
//! --target pprof`; or `kiln-fuzz --write-seeds DIR` to lay out the seed
//! corpus of every target under `DIR/<target>/`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Kiln's parsers under AFL++")]
struct Cli {
    /// The target to fuzz: pprof, folded, multipart, push_json, otlp,
    /// wal_record, block, connect, select_series, otlp_revisions,
    /// query_trees, recorded, debuginfo or symbol_cache.
    #[arg(long, env = "KILN_FUZZ_TARGET")]
    target: Option<String>,
    /// Write each target's seed inputs under this directory and exit.
    #[arg(long, env = "KILN_FUZZ_WRITE_SEEDS")]
    write_seeds: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = cli.write_seeds {
        for target in kiln_fuzz::TARGETS {
            let target_dir = dir.join(target);
            for (i, seed) in kiln_fuzz::seeds(target).iter().enumerate() {
                let written = std::fs::create_dir_all(&target_dir)
                    .and_then(|()| std::fs::write(target_dir.join(format!("seed-{i}")), seed));
                if let Err(error) = written {
                    eprintln!("kiln-fuzz: writing {}: {error}", target_dir.display());
                    return ExitCode::FAILURE;
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let Some(target) = cli.target else {
        eprintln!("kiln-fuzz: --target or --write-seeds is required");
        return ExitCode::FAILURE;
    };
    if !kiln_fuzz::TARGETS.contains(&target.as_str()) {
        eprintln!(
            "kiln-fuzz: unknown target {target}; one of {:?}",
            kiln_fuzz::TARGETS
        );
        return ExitCode::FAILURE;
    }
    afl::fuzz!(|data: &[u8]| {
        kiln_fuzz::run(&target, data);
    });
    ExitCode::SUCCESS
}
