//! Synthetic checkpoints: a model folder of any real config shape with seeded
//! random weights, for measuring speed and memory where real weights cannot
//! go (the GPU machine takes at most 64 MiB of files) and for CPU-vs-GPU
//! parity checks. Never for accuracy claims: the text such a model writes is
//! noise.
//!
//! The folder looks like a prepared one (`config.json`, `model.safetensors`,
//! a byte-level `tokenizer.json` with the ChatML specials) plus a ranking with
//! seeded random scores in `ranking/neurons.ranking.safetensors`, so every mode (dense,
//! load-only, selectinfer, …) loads it through the same code as real weights,
//! selective loading by `pread` included.

use crate::method::ranking::{LayerRanking, ModelIdentity, Ranking, RankingMeta, TaskMeta};
use crate::model::Config;
use anyhow::{bail, Context, Result};
use candle_core::DType;
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Tasks the random ranking holds (the profiler's task names).
const TASKS: &[&str] = &["qa", "translation", "summarization"];
/// Elements per independently seeded chunk (fixed, so the weights do not
/// depend on the thread count).
const CHUNK: usize = 1 << 20;
/// Standard deviation of the projection weights (the usual init).
const WEIGHT_STD: f32 = 0.02;

/// One tensor of the synthetic checkpoint.
struct Spec {
    name: String,
    shape: Vec<usize>,
    /// Norm weights are ones; everything else uniform with [`WEIGHT_STD`].
    ones: bool,
}

fn tensor_specs(cfg: &Config) -> Vec<Spec> {
    let (h, n, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim(),
        cfg.num_kv_heads() * cfg.head_dim(),
    );
    let w = |name: String, shape: Vec<usize>| Spec {
        name,
        shape,
        ones: false,
    };
    let norm = |name: String| Spec {
        name,
        shape: vec![h],
        ones: true,
    };
    let mut specs = vec![w("model.embed_tokens.weight".into(), vec![v, h])];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        specs.push(norm(format!("{p}.input_layernorm.weight")));
        for (part, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            specs.push(w(format!("{p}.self_attn.{part}.weight"), vec![out, h]));
            if cfg.qkv_bias() {
                specs.push(w(format!("{p}.self_attn.{part}.bias"), vec![out]));
            }
        }
        specs.push(w(format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        specs.push(norm(format!("{p}.post_attention_layernorm.weight")));
        specs.push(w(format!("{p}.mlp.gate_proj.weight"), vec![n, h]));
        specs.push(w(format!("{p}.mlp.up_proj.weight"), vec![n, h]));
        specs.push(w(format!("{p}.mlp.down_proj.weight"), vec![h, n]));
    }
    specs.push(norm("model.norm.weight".into()));
    if !cfg.tie_word_embeddings {
        specs.push(w("lm_head.weight".into(), vec![v, h]));
    }
    specs
}

/// splitmix64: a small, good, seedable generator.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Little-endian bytes of `count` elements of tensor number `index`:
/// chunk `c` is drawn from seed `(seed, index, c)`, chunks in parallel.
fn tensor_bytes(spec: &Spec, index: usize, seed: u64, dtype: DType) -> Vec<u8> {
    let count: usize = spec.shape.iter().product();
    let size = dtype.size_in_bytes();
    let mut out = vec![0u8; count * size];
    // Uniform on [-a, a] has std a/√3.
    let scale = WEIGHT_STD * 3f32.sqrt();
    let fill = |chunk_index: usize, bytes: &mut [u8]| {
        let mut rng = SplitMix(
            seed ^ (index as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)
                ^ (chunk_index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        for e in bytes.chunks_exact_mut(size) {
            let x = if spec.ones { 1.0 } else { rng.unit() * scale };
            match dtype {
                DType::F16 => e.copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                DType::BF16 => e.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
                _ => e.copy_from_slice(&x.to_le_bytes()),
            }
        }
    };
    use rayon::prelude::*;
    out.par_chunks_mut(CHUNK * size)
        .enumerate()
        .for_each(|(c, bytes)| fill(c, bytes));
    out
}

fn safetensors_dtype(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        other => bail!("synthetic weights are f32, f16 or bf16, not {other:?}"),
    })
}

/// Writes `model.safetensors` one tensor at a time (memory: one tensor).
fn write_weights(path: &Path, specs: &[Spec], seed: u64, dtype: DType) -> Result<()> {
    let size = dtype.size_in_bytes();
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for s in specs {
        let bytes = s.shape.iter().product::<usize>() * size;
        header.insert(
            s.name.clone(),
            serde_json::json!({
                "dtype": safetensors_dtype(dtype)?,
                "shape": s.shape,
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
    }
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "selectinfer": "synthetic random weights"}),
    );
    let mut json = serde_json::to_vec(&header)?;
    // The data must start 8-byte aligned.
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
    w.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&json).map_err(io)?;
    for (i, s) in specs.iter().enumerate() {
        w.write_all(&tensor_bytes(s, i, seed, dtype)).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(())
}

/// A byte-level BPE over the 256 byte symbols plus the ChatML specials
/// (no merges: one token per byte). Ids stay far below any real vocabulary.
fn write_tokenizer(dir: &Path) -> Result<()> {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    let mut symbols: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    symbols.sort_unstable();
    let vocab: tokenizers::models::bpe::Vocab = symbols
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .map_err(|e| anyhow::anyhow!("building the synthetic tokenizer: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, false)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| anyhow::anyhow!("adding special tokens: {e}"))?;
    let path = dir.join("tokenizer.json");
    tokenizer
        .save(&path, false)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}

/// A ranking with seeded random scores for every task and the model-wide
/// order, tied to the synthetic weights' sha256.
fn write_ranking(dir: &Path, cfg: &Config, seed: u64) -> Result<PathBuf> {
    let mut rng = SplitMix(seed ^ 0x5EED_0F5C_0AE5);
    let mut random = || -> LayerRanking {
        LayerRanking::from_scores(
            (0..cfg.num_hidden_layers)
                .map(|_| {
                    (0..cfg.intermediate_size)
                        .map(|_| rng.unit().abs())
                        .collect()
                })
                .collect(),
        )
    };
    let tasks: BTreeMap<String, LayerRanking> =
        TASKS.iter().map(|t| (t.to_string(), random())).collect();
    let ranking = Ranking {
        meta: RankingMeta {
            format: crate::method::ranking::FORMAT.to_string(),
            version: crate::method::ranking::VERSION,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            model: ModelIdentity::new(cfg, crate::model::weights_sha256(dir)?),
            tasks: TASKS
                .iter()
                .map(|t| TaskMeta {
                    name: t.to_string(),
                    dataset: "synthetic".into(),
                    dataset_sha256: String::new(),
                    skip: 0,
                    stride: 1,
                    examples: 0,
                    skipped_too_long: 0,
                    tokens: 0,
                    prompt_template: String::new(),
                })
                .collect(),
            generated_tokens: 0,
            score: format!("seeded random scores (seed {seed}): synthetic model, speed only"),
        },
        tasks,
        model_wide: random(),
    };
    let path = dir.join(crate::method::ranking::IN_MODEL_FILE);
    ranking.save(&path)?;
    Ok(path)
}

/// Writes a synthetic checkpoint of the shape in `config_path` into `out`
/// (config.json, model.safetensors, tokenizer.json, ranking/).
/// Deterministic in `seed`.
pub fn write_model(config_path: &Path, out: &Path, seed: u64, dtype: DType) -> Result<()> {
    let cfg = Config::from_file(config_path)?;
    safetensors_dtype(dtype)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(config_path)
            .with_context(|| format!("reading {}", config_path.display()))?,
    )?;
    json["torch_dtype"] = serde_json::json!(match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        _ => "float32",
    });
    json["selectinfer_synthetic_seed"] = serde_json::json!(seed);
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&json)?,
    )
    .with_context(|| format!("writing {}/config.json", out.display()))?;
    write_weights(
        &out.join("model.safetensors"),
        &tensor_specs(&cfg),
        seed,
        dtype,
    )?;
    write_tokenizer(out)?;
    write_ranking(out, &cfg, seed)?;
    Ok(())
}
