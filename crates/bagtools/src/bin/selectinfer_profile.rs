//! `selectinfer_profile`: the offline profiler. Scores every FFN neuron on the
//! task datasets of a YAML config (and the prompts of a recorded rosbag2
//! topic) and writes a ranking file.

use anyhow::{Context, Result};
use clap::Parser;
use selectinfer::engine::Engine;
use selectinfer::model::LoadOptions;
use selectinfer::store::home::{self, Missing};
use selectinfer::sys::device::WeightDtype;
use selectinfer_bagtools::profile::{self, DatasetSpec, ProfileConfig};
use std::path::PathBuf;
use std::process::ExitCode;

/// Task of `--bag`'s prompts when `--task` is not given.
const BAG_TASK: &str = "robot";

const BAG_HELP: &str = "Prompts from a robot (--bag, --topic): the prompts recorded on the topic \
(selectinfer_msgs/msg/Prompt or std_msgs/msg/String; a bag folder as `ros2 bag record` writes it, \
MCAP or sqlite3, or its .mcap/.db3 file) become the dataset of --task (default robot), in time \
order, each used as recorded (a Prompt's earlier turns included) with the model's chat template; \
all of them unless --examples. Prompts the node would refuse (empty) are skipped. The config's \
datasets are kept, one of the same task name replaced: the file still has the tasks the node \
knows and a model-wide ranking over all of them, plus the new task (run the node with \
task:=robot). --bag-only profiles the bag's prompts alone (faster; the model-wide ranking is \
then the bag's). The file goes to --output, else the config's output (the node's default \
ranking for the model).";

#[derive(Parser)]
#[command(
    name = "selectinfer_profile",
    version,
    about = "Profile FFN neurons and write a SelectInfer ranking file",
    after_help = BAG_HELP
)]
struct Args {
    /// Profile configuration (YAML); the flags below override it.
    #[arg(long, default_value = "config/profile.yaml")]
    config: PathBuf,
    /// A catalog model by name (resolved in the models home) or a model folder.
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
    /// rosbag2 bag (folder, .mcap or .db3) whose prompts on --topic become
    /// the dataset of --task (see below).
    #[arg(long, requires = "topic", value_name = "DIR")]
    bag: Option<PathBuf>,
    /// Topic of --bag that carries the prompts, e.g. /selectinfer_node/prompt.
    #[arg(long, requires = "bag", value_name = "NAME")]
    topic: Option<String>,
    /// Task name of the bag's prompts [default: robot].
    #[arg(long, requires = "bag", value_name = "NAME")]
    task: Option<String>,
    /// Profile only the bag's prompts, not the config's datasets.
    #[arg(long, requires = "bag")]
    bag_only: bool,
}

fn run(args: Args) -> Result<()> {
    let mut cfg = ProfileConfig::from_yaml(&args.config)?;
    if let Some(m) = args.model {
        cfg.model = m;
    }
    if let Some(o) = args.output {
        cfg.output = o;
    }
    if let (Some(bag), Some(topic)) = (&args.bag, &args.topic) {
        let spec = DatasetSpec::bag(args.task.as_deref().unwrap_or(BAG_TASK), bag, topic);
        if args.bag_only {
            cfg.datasets = vec![spec];
        } else if let Some(d) = cfg.datasets.iter_mut().find(|d| d.task == spec.task) {
            *d = spec;
        } else {
            cfg.datasets.push(spec);
        }
    }
    if let Some(n) = args.examples {
        cfg.datasets.iter_mut().for_each(|d| d.examples = n);
    }
    if let Some(g) = args.generated_tokens {
        cfg.generated_tokens = g;
    }
    cfg.validate()?;
    // A catalog name resolves in the models home (prepared on first use).
    cfg.model = home::resolve(&cfg.model.to_string_lossy(), args.dtype, Missing::Prepare)?.folder;
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
