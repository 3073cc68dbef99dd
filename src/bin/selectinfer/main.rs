//! `selectinfer` command-line tool: prepare models, generate text, evaluate,
//! benchmark, write synthetic models, check a device against the CPU. Each
//! command parses its flags ([`cli`]), calls the library and prints.

mod args;
mod cli;
mod fidelity_cmd;
mod gate_args;
mod tune_cmd;
use anyhow::{bail, Result};
use clap::{CommandFactory, FromArgMatches};
use cli::{Cli, Command};
use selectinfer::engine::{conversation, GenerateOptions, Generator, Grammar, Sampling};
use selectinfer::store::home::{self, Missing};
use selectinfer::store::{prepare, preset, quantize};
use selectinfer::sys::device::{Quant, WeightDtype};
use selectinfer::tools::bench::{self, BenchEngine};
use selectinfer::tools::{eval, fidelity, gguf, hotswap, parity, synth};
use std::io::Write;
use std::process::ExitCode;

fn run(mut cli: Cli, given: &clap::ArgMatches) -> Result<()> {
    if let Some(n) = cli.threads {
        selectinfer::sys::threads::set(n)?;
    }
    if let (Some(model), Some((_, flags))) = (cli.command.model_args_mut(), given.subcommand()) {
        model.resolve(flags)?;
    }
    match cli.command {
        Command::PrepareModel {
            name,
            dir,
            dtype,
            all,
        } => {
            let dir = dir.map_or_else(home::models_home, Ok)?;
            let keep = preset::keep_for_serving(&name, all)?;
            println!(
                "{}",
                prepare::prepare_model(&name, &dir, dtype, keep)?.display()
            );
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
            let out = engine.generate_turns(&turns, &[], &opts, |piece| {
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
            lenient_calls,
            gate,
            json,
        } => {
            if kind == BenchEngine::CandleGguf && !model.plain() {
                bail!("--engine candle-gguf runs the GGUF as is: it takes no --mode, --vocab or --head-screen");
            }
            let mut engine: Box<dyn Generator> = match kind {
                BenchEngine::Dense => Box::new(model.spec().load()?),
                BenchEngine::CandleGguf => Box::new(gguf::GgufEngine::load(&model.folder)?),
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
                lenient_calls,
                call_thresholds: gate.thresholds(),
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
            gguf,
            reference_dtype,
            data,
            limit,
            skip,
            tokens,
            json,
        } => {
            let opts = fidelity::FidelityOptions {
                data,
                limit,
                skip,
                tokens,
            };
            let with_gguf = gguf;
            fidelity_cmd::run(
                &model,
                &dtypes,
                &candidate,
                with_gguf,
                reference_dtype,
                &opts,
                json,
            )?;
        }
        Command::Quantize { model, dtype } => {
            let folder = home::resolve(&model, WeightDtype::F32, Missing::Refuse)?.folder;
            for q in dtype.map_or(vec![Quant::Q8, Quant::Q4], |q| vec![q]) {
                println!("{}", quantize::quantize_model(&folder, q)?.display());
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
        Command::Tune(args) => {
            println!(
                "{}",
                tune_cmd::run(args, cli.threads.unwrap_or(0))?.display()
            );
        }
        Command::Bench {
            model,
            engine,
            new_tokens,
            bandwidth,
            prompt_ids,
            json,
        } => {
            let prompts = prompt_ids.as_deref();
            let report = bench::run_spec(&model.spec(), engine, new_tokens, bandwidth, prompts)?;
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
    let given = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&given) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(cli, &given) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
