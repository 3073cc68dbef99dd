//! A Rust program using the engine without ROS: a catalog model by name
//! (prepared in the models home on first use), loaded dense q4 or at the
//! method's knobs, answering one chat prompt with its text streamed.
//!
//!     cargo run --release --example engine_generate -- \
//!         [MODEL] ["PROMPT"] [MODE] [COMPUTE_RATIO]
//!
//! e.g. `... -- qwen2.5-coder-0.5b-instruct "List three safety checks." coreinfer 0.8`

use selectinfer::engine::{EngineSpec, GenerateOptions};
use selectinfer::method::Mode;
use selectinfer::store::home::{self, Missing};
use selectinfer::store::installed;
use selectinfer::sys::device::WeightDtype;
use std::io::Write;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let name = arg(0, "smollm2-135m-instruct");
    let prompt = arg(1, "List three safety checks before a robot arm moves.");
    let mode: Mode = arg(2, "dense").parse()?;
    let compute_ratio: f64 = arg(3, "0.8").parse()?;

    // A catalog name or a folder; a missing catalog model is downloaded,
    // verified and converted (as the node and the CLI do).
    let model = home::resolve(&name, WeightDtype::Q4, Missing::Prepare)?;
    let mut spec = EngineSpec {
        model: model.folder.clone(),
        dtype: WeightDtype::Q4,
        mode,
        ..EngineSpec::default()
    };
    if mode != Mode::Dense {
        // The shipped ranking of the model (rankings/NAME.ranking.safetensors).
        spec.ranking = Some(installed::ranking(&model.folder, &model.name())?);
        spec.params.compute_ratio = compute_ratio;
    }
    let mut engine = spec.load()?;

    let opts = GenerateOptions {
        max_new_tokens: 96,
        ..GenerateOptions::default()
    };
    let reply = engine.generate_chat(&prompt, &opts, |piece| {
        print!("{piece}");
        std::io::stdout().flush().is_ok()
    })?;
    println!(
        "\n[{} prompt + {} new tokens, TTFT {:.2} s, {:.1} tok/s, stop: {:?}]",
        reply.prompt_tokens,
        reply.generated_tokens,
        reply.ttft_s,
        reply.decode_tokens_per_s,
        reply.stop_reason
    );
    Ok(())
}
