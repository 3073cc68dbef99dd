//! Explains greedy divergences from llama.cpp on SmolLM2: for each fixture
//! prompt, runs our f32 model and candle's quantized GGUF model (which, like
//! llama.cpp, quantizes activations to 8 bits inside its Q4 matmuls) and
//! prints, at the first position where we differ from llama.cpp, our logit
//! margin between our token and llama.cpp's.
//! Run: cargo run --release -p selectinfer-lab --example greedy_divergence
use candle_core::{Device, Tensor};
use selectinfer::engine::Engine;
use selectinfer::model::LoadOptions;
fn main() -> anyhow::Result<()> {
    let dir = std::path::Path::new("models/smollm2-135m-instruct");
    let engine = Engine::load(dir, &LoadOptions::default())?;
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        "tests/fixtures/llamacpp_greedy_smollm2-135m-instruct.json",
    )?)?;
    let mut f = std::fs::File::open(dir.join("model.gguf"))?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut f)?;
    let mut q = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut f,
        &Device::Cpu,
    )?;
    for case in fx["cases"].as_array().unwrap() {
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids_no_stop"]);
        // Teacher-forced along llama.cpp's tokens.
        let mut cache = engine.model.new_cache();
        q.clear_kv_cache();
        let mut input = prompt.clone();
        let mut pos = 0;
        let mut qtoks = Vec::new();
        for (step, &w) in want.iter().take(16).enumerate() {
            let logits = engine.model.forward(&input, &mut cache)?.to_vec1::<f32>()?;
            let ql = q
                .forward(
                    &Tensor::new(input.as_slice(), &Device::Cpu)?.unsqueeze(0)?,
                    pos,
                )?
                .flatten_all()?
                .to_vec1::<f32>()?;
            pos += input.len();
            let argmax = |l: &[f32]| {
                l.iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .unwrap()
                    .0 as u32
            };
            let (ours, quant) = (argmax(&logits), argmax(&ql));
            qtoks.push(quant);
            if ours != w {
                println!(
                    "{:?} step {step}: llama.cpp {w} ({:?}), ours {ours} ({:?}); our logits {:.3} vs {:.3} (margin {:.3}); candle-gguf picks {quant}, its logits {:.3} vs {:.3}",
                    case["prompt"].as_str().unwrap().lines().nth(1).unwrap_or(""),
                    engine.codec.decode(&[w])?, engine.codec.decode(&[ours])?,
                    logits[ours as usize], logits[w as usize], logits[ours as usize] - logits[w as usize],
                    ql[quant as usize], ql[w as usize]
                );
            }
            input = vec![w];
        }
        println!(
            "candle-gguf teacher-forced argmax == llama.cpp: {}/16",
            qtoks.iter().zip(&want).filter(|(a, b)| a == b).count()
        );
    }
    Ok(())
}
