//! `selectinfer` command-line tool: prepare models, generate text, evaluate,
//! benchmark, write synthetic models, check a device against the CPU. Each
//! command parses its flags ([`cli`]), calls the library and prints.

mod args;
mod cli;
use anyhow::{bail, Result};
use clap::Parser;
use cli::{Cli, Command};
use selectinfer::engine::grammar::Grammar;
use selectinfer::engine::text::conversation;
use selectinfer::engine::{EngineSpec, GenerateOptions, Generator, Sampling};
use selectinfer::method::Mode;
use selectinfer::sys::device::Quant;
use selectinfer::tools::bench::{self, BenchEngine, BenchOptions};
use selectinfer::tools::{eval, fidelity, gguf, hotswap, parity, prepare, quantize, synth};
use std::io::Write;
use std::process::ExitCode;

fn run(cli: Cli) -> Result<()> {
    if let Some(n) = cli.threads {
        selectinfer::sys::threads::set(n)?;
    }
    match cli.command {
        Command::PrepareModel { name, dir, dtype } => {
            println!("{}", prepare::prepare_model(&name, &dir, dtype)?.display());
        }
        Command::Generate {
            model,
            prompt,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            system,
            stop,
            json_schema,
            json,
        } => {
            let sampling = Sampling {
                temperature,
                top_p,
                seed,
            };
            sampling.validate()?;
            let grammar = match json_schema {
                Some(path) => Some(Grammar::JsonSchema(
                    std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?,
                )),
                None => None,
            };
            let opts = GenerateOptions {
                max_new_tokens,
                sampling,
                stop,
                grammar,
                ..Default::default()
            };
            let turns = conversation(&system, &[], &prompt)?;
            let mut engine = model.spec().load()?;
            let out = engine.generate_turns(&turns, &opts, |piece| {
                if !json {
                    print!("{piece}");
                    let _ = std::io::stdout().flush();
                }
                true
            })?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&out)?),
                false => println!(),
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
            if kind == BenchEngine::CandleGguf && !model.plain() {
                bail!("--engine candle-gguf runs the GGUF as is: it takes no --mode, --vocab or --head-screen");
            }
            let mut engine: Box<dyn Generator> = match kind {
                BenchEngine::Dense => Box::new(model.spec().load()?),
                BenchEngine::CandleGguf => Box::new(gguf::GgufEngine::load(&model.model)?),
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
                let n = eval::write_prompts(engine.as_ref(), &opts, &out)?;
                println!("{n} prompts written to {}", out.display());
                return Ok(());
            }
            let report = eval::run(engine.as_mut(), &opts)?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&report)?),
                false => println!("{report}"),
            }
        }
        Command::Fidelity {
            model,
            dtypes,
            candidate,
            gguf: with_gguf,
            reference_dtype,
            data,
            limit,
            skip,
            tokens,
            json,
        } => {
            let spec = model.spec();
            let mut reference = EngineSpec {
                dtype: reference_dtype,
                mode: Mode::Dense,
                vocab: Default::default(),
                head_screen: 0,
                ..spec.clone()
            }
            .load()?;
            let mut lineup = fidelity::Lineup::load(&spec, &candidate, &dtypes)?;
            let mut q = match with_gguf {
                true => Some(gguf::GgufEngine::load(&model.model)?.into_parts()),
                false => None,
            };
            let mut names = lineup.names.clone();
            let mut candidates = lineup.candidates();
            if let Some((q, _, bytes)) = q.as_mut() {
                candidates.push(fidelity::Candidate::Gguf(q, *bytes));
                names.push("candle-gguf".into());
            }
            let opts = fidelity::FidelityOptions {
                data,
                limit,
                skip,
                tokens,
            };
            let report =
                fidelity::run_with_progress(&mut reference, &mut candidates, &opts, &mut |p| {
                    eprintln!("{p}")
                })?;
            let named: Vec<_> = names.iter().zip(&report).collect();
            match json {
                true => println!("{}", serde_json::to_string_pretty(&named)?),
                false => named.iter().for_each(|(n, tasks)| {
                    tasks.iter().for_each(|t| println!("{n}: {t}"));
                }),
            }
        }
        Command::Quantize { model, dtype } => {
            for q in dtype.map_or(vec![Quant::Q8, Quant::Q4], |q| vec![q]) {
                println!("{}", quantize::quantize_model(&model, q)?.display());
            }
        }
        Command::SynthModel {
            shape,
            out,
            seed,
            dtype,
        } => {
            synth::write_model(&shape, &out, seed, dtype.tensor_dtype("synth-model")?)?;
            println!("{}", out.display());
        }
        Command::DeviceCheck {
            model,
            modes,
            prompt,
            steps,
        } => {
            if model.device.trim() == "cpu" {
                bail!("device-check compares the CPU with another device: pass --device cuda:N");
            }
            let reports = modes
                .iter()
                .map(|&mode| {
                    let spec = selectinfer::engine::EngineSpec {
                        mode,
                        ..model.spec()
                    };
                    parity::parity(&spec, &model.device, &prompt, steps)
                })
                .collect::<Result<Vec<_>>>()?;
            println!("{}", serde_json::to_string_pretty(&reports)?);
        }
        Command::HotSwap {
            model,
            to,
            new_tokens,
            json,
        } => {
            let report = hotswap::measure(&model.spec(), &to, new_tokens)?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&report)?),
                false => println!("{report}"),
            }
        }
        Command::Bench {
            model,
            engine,
            new_tokens,
            bandwidth,
            json,
        } => {
            // Under a memory budget, γ as planned (tokenizer resident, as in a load).
            let codec = selectinfer::engine::text::TextCodec::from_model_dir(&model.model)?;
            let (spec, _) = model.spec().planned()?;
            drop(codec);
            let load = spec.load_options()?; // first: a missing device is the error to report
            let opts = BenchOptions {
                method: spec.method()?,
                engine,
                new_tokens,
                measure_bandwidth: bandwidth,
                vocab: spec.vocab,
                head_screen: (spec.head_screen, spec.head_screen_bits),
            };
            let report = bench::run(&spec.model, &load, &opts)?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&report)?),
                false => println!("{report}"),
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
