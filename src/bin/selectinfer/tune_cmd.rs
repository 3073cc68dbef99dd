//! `selectinfer tune`: resolves the catalog model, runs the search
//! (`selectinfer::tools::tune`) and writes the preset.

use anyhow::{Context, Result};
use clap::Args;
use selectinfer::engine::defaults::{self, CLI};
use selectinfer::engine::EngineSpec;
use selectinfer::method::SelectionParams;
use selectinfer::model::Config;
use selectinfer::store::home::{self, Missing};
use selectinfer::store::{installed, preset};
use selectinfer::sys::device::WeightDtype;
use selectinfer::tools::tune::{self, TuneOptions};
use std::path::{Path, PathBuf};

/// The flags of `selectinfer tune`.
#[derive(Args)]
pub struct TuneArgs {
    /// Catalog model name (prepared on first use).
    #[arg(long, default_value = CLI.model)]
    pub model: String,
    /// Peak RSS (MiB) a configuration may reach.
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Share of dense q4's EM / ROUGE-L / BLEU kept on every task.
    #[arg(long, default_value_t = 0.95)]
    pub floor: f64,
    /// Task whose base neurons the selective candidates load (a task of
    /// the ranking: one `selectinfer_profile --bag` wrote, say).
    #[arg(long, default_value = CLI.task)]
    pub task: String,
    /// Ranking file (default: the model's installed ranking).
    #[arg(long)]
    pub ranking: Option<PathBuf>,
    /// Dev task files, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = defaults::DEV_SETS)]
    pub data: Vec<PathBuf>,
    /// Teacher-forced prompts per task in the pruning stage.
    #[arg(long, default_value_t = 6)]
    pub prune_prompts: usize,
    /// Positions compared per pruning prompt.
    #[arg(long, default_value_t = 24)]
    pub prune_tokens: usize,
    /// Least top-1 agreement with dense q4 (every task) to be measured.
    #[arg(long, default_value_t = 0.9)]
    pub min_top1: f64,
    /// Dev rows per task scored.
    #[arg(long, default_value_t = 30)]
    pub rows: usize,
    /// State folder (default runs/tune/NAME; resumed when present).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Preset written (default: config/models/NAME.yaml of the source tree).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The search's figures as JSON (default: docs/bench/tune-NAME.json of
    /// the source tree; `scripts/bench_presets.py` reads it).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Runs the search with `threads` compute threads per bench (0: all) and
/// writes the preset; returns its path.
pub fn run(a: TuneArgs, threads: usize) -> Result<PathBuf> {
    let entry = home::catalog_of(&a.model).with_context(|| {
        format!(
            "tune writes a catalog model's preset: `{}` is not a catalog name ({})",
            a.model,
            home::known()
        )
    })?;
    let model = home::resolve(entry.name, WeightDtype::Q4, Missing::Prepare)?;
    let base = EngineSpec {
        model: model.folder.clone(),
        dtype: WeightDtype::Q4,
        ranking: Some(match a.ranking {
            Some(r) => r,
            None => installed::ranking(&model.folder, entry.name)?,
        }),
        params: SelectionParams {
            task: a.task.clone(),
            ..CLI.selection_params()
        },
        ..EngineSpec::default()
    };
    let layers = Config::from_file(&model.folder.join("config.json"))?.num_hidden_layers;
    let candidates = tune::candidates(layers);
    let opts = TuneOptions {
        model: entry.name.to_string(),
        base,
        data: a.data,
        prune_prompts: a.prune_prompts,
        prune_tokens: a.prune_tokens,
        min_top1: a.min_top1,
        rows: a.rows,
        floor: a.floor,
        memory_budget_mb: a.memory_budget_mb,
        threads,
        state_dir: a
            .state
            .unwrap_or_else(|| Path::new("runs/tune").join(entry.name)),
    };
    let state = tune::run(&opts, &candidates, &mut |p| eprintln!("tune: {p}"))?;
    let out = a.out.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(preset::DIR)
            .join(format!("{}.yaml", entry.name))
    });
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = format!("selectinfer {}", args.join(" "));
    tune::write_preset(&out, &command, &state, &candidates, &opts)?;
    let report = a.report.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("docs/bench/tune-{}.json", entry.name))
    });
    std::fs::write(&report, serde_json::to_string_pretty(&state)?)
        .with_context(|| format!("writing {}", report.display()))?;
    Ok(out)
}
