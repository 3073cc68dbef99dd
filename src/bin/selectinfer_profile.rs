//! `selectinfer_profile`: the offline profiler. Scores every FFN neuron on the
//! task datasets of a YAML config and writes a ranking file.

use anyhow::{Context, Result};
use clap::Parser;
use selectinfer::engine::Engine;
use selectinfer::model::LoadOptions;
use selectinfer::sys::device::WeightDtype;
use selectinfer::tools::profile::{self, ProfileConfig};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "selectinfer_profile",
    version,
    about = "Profile FFN neurons and write a SelectInfer ranking file"
)]
struct Args {
    /// Profile configuration (YAML); the flags below override it.
    #[arg(long, default_value = "config/profile.yaml")]
    config: PathBuf,
    /// Model folder.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Ranking file to write.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Examples per dataset (overrides every dataset's `examples`).
    #[arg(long)]
    examples: Option<usize>,
    /// Generated tokens scored per example.
    #[arg(long)]
    generated_tokens: Option<usize>,
    /// Also write the markdown analysis (task overlap, mass, stability) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Run the same forward passes without scoring (overhead baseline); writes nothing.
    #[arg(long)]
    no_score: bool,
    /// Weight dtype the profiled model runs in (f32, f16, q8, q4).
    #[arg(long, default_value_t = WeightDtype::F32)]
    dtype: WeightDtype,
}

fn run(args: Args) -> Result<()> {
    let mut cfg = ProfileConfig::from_yaml(&args.config)?;
    if let Some(m) = args.model {
        cfg.model = m;
    }
    if let Some(o) = args.output {
        cfg.output = o;
    }
    if let Some(n) = args.examples {
        cfg.datasets.iter_mut().for_each(|d| d.examples = n);
    }
    if let Some(g) = args.generated_tokens {
        cfg.generated_tokens = g;
    }
    cfg.validate()?;
    let opts = LoadOptions {
        dtype: args.dtype.dtype(),
        quant: args.dtype.quant(),
        ..LoadOptions::default()
    };
    let engine = Engine::load(&cfg.model, &opts)?;
    let run = profile::run(&engine, &cfg.model, &cfg, !args.no_score)?;
    println!(
        "{} {} tokens in {:.1} s: {:.1} tokens/s",
        if args.no_score {
            "ran (no scoring)"
        } else {
            "profiled"
        },
        run.tokens,
        run.seconds,
        run.tokens_per_s()
    );
    if args.no_score {
        return Ok(());
    }
    run.ranking.save(&cfg.output)?;
    println!("wrote {}", cfg.output.display());
    if let Some(path) = args.report {
        let title = cfg
            .model
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        std::fs::write(&path, run.report(&title))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
