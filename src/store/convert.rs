//! GGUF → HF checkpoint conversion.
//!
//! Reads a llama.cpp GGUF file with candle's reader and writes what an HF
//! checkpoint folder holds: `config.json` (from the GGUF metadata),
//! `tokenizer.json` (a byte-level BPE built with the tokenizers crate from the
//! GGUF vocabulary and merges), `tokenizer_config.json` (chat template and
//! special tokens) and `model.safetensors` (dequantized weights with HF names
//! and layout). The output is deterministic: the same GGUF gives byte-identical
//! files.

use crate::sys::device::WeightDtype;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// Bumped whenever the converter's output changes, so old folders get redone.
pub(crate) const CONVERTER_VERSION: u32 = 2;
const STAMP_FILE: &str = "prepared.json";

/// PyTorch's name of a weight dtype (in `config.json`).
fn torch_name(dtype: WeightDtype) -> Result<&'static str> {
    Ok(match dtype.tensor_dtype("model.safetensors")? {
        candle_core::DType::F16 => "float16",
        candle_core::DType::BF16 => "bfloat16",
        _ => "float32",
    })
}

#[derive(serde::Serialize, serde::Deserialize, PartialEq)]
struct Stamp {
    converter_version: u32,
    gguf_sha256: String,
    dtype: WeightDtype,
}

/// True when `dir` holds a complete conversion of the GGUF with this hash.
pub(crate) fn is_converted(dir: &Path, gguf_sha256: &str, dtype: WeightDtype) -> bool {
    let want = Stamp {
        converter_version: CONVERTER_VERSION,
        gguf_sha256: gguf_sha256.to_string(),
        dtype,
    };
    let stamp_ok = fs::read(dir.join(STAMP_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<Stamp>(&b).ok())
        .is_some_and(|s| s == want);
    stamp_ok
        && [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ]
        .iter()
        .all(|f| dir.join(f).is_file())
}

/// The architecture families we convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    fn prefix(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

struct Gguf {
    path: std::path::PathBuf,
    content: gguf_file::Content,
}

/// Reads a GGUF header with candle's reader, which panics on some
/// malformed files (an alignment of 0 divides by zero): that is the file's
/// error, not a crash. Every GGUF reader of the project goes through here.
pub(crate) fn read_gguf_header(path: &Path, f: &mut fs::File) -> Result<gguf_file::Content> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gguf_file::Content::read(f)))
        .map_err(|_| anyhow::anyhow!("malformed GGUF header (candle's reader panicked)"))
        .and_then(|r| Ok(r?))
        .with_context(|| format!("{} is not a readable GGUF file", path.display()))
}

impl Gguf {
    fn open(path: &Path) -> Result<Self> {
        let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let content = read_gguf_header(path, &mut f)?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
        })
    }
    fn value(&self, key: &str) -> Result<&gguf_file::Value> {
        self.content.metadata.get(key).with_context(|| {
            format!(
                "{}: GGUF metadata key '{key}' is missing",
                self.path.display()
            )
        })
    }
    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        let n = match v {
            gguf_file::Value::U64(x) => *x,
            gguf_file::Value::I64(x) => *x as u64,
            other => other
                .to_u32()
                .map(u64::from)
                .or_else(|_| other.to_i32().map(|x| x as u64))?,
        };
        Ok(n as usize)
    }
    fn f64(&self, key: &str) -> Result<f64> {
        let v = self.value(key)?;
        // f32 metadata is printed at f32 precision (1e-5, not 9.99999974e-6).
        match v.to_f32() {
            Ok(x) => Ok(x.to_string().parse()?),
            Err(_) => Ok(v.to_f64()?),
        }
    }
    fn string(&self, key: &str) -> Result<String> {
        Ok(self.value(key)?.to_string()?.clone())
    }
    fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.value(key)?
            .to_vec()?
            .iter()
            .map(|v| Ok(v.to_string()?.clone()))
            .collect()
    }
    fn ints(&self, key: &str) -> Result<Vec<i64>> {
        self.value(key)?
            .to_vec()?
            .iter()
            .map(|v| {
                Ok(v.to_i32()
                    .map(i64::from)
                    .or_else(|_| v.to_u32().map(i64::from))?)
            })
            .collect()
    }
    fn arch(&self) -> Result<Arch> {
        match self.string("general.architecture")?.as_str() {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            other => bail!(
                "{}: unsupported architecture '{other}' (llama and qwen2 are supported)",
                self.path.display()
            ),
        }
    }
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let mut f = fs::File::open(&self.path)?;
        let q = self
            .content
            .tensor(&mut f, name, &Device::Cpu)
            .with_context(|| format!("{}: reading tensor {name}", self.path.display()))?;
        Ok(q.dequantize(&Device::Cpu)?)
    }
}

/// Converts `gguf` into `out` (see the module docs).
pub(crate) fn convert_gguf(
    gguf: &Path,
    out: &Path,
    gguf_sha256: &str,
    dtype: WeightDtype,
) -> Result<()> {
    let g = Gguf::open(gguf)?;
    let arch = g.arch()?;
    let config = hf_config(&g, arch, dtype)?;
    let tokenizer = build_tokenizer(&g)?;
    tokenizer
        .save(out.join("tokenizer.json"), false)
        .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
    write_json(&out.join("tokenizer_config.json"), &tokenizer_config(&g)?)?;
    write_json(&out.join("config.json"), &config)?;
    write_weights(&g, arch, &config, dtype, &out.join("model.safetensors"))?;
    write_json(
        &out.join(STAMP_FILE),
        &serde_json::to_value(Stamp {
            converter_version: CONVERTER_VERSION,
            gguf_sha256: gguf_sha256.to_string(),
            dtype,
        })?,
    )?;
    Ok(())
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let s = serde_json::to_string_pretty(v)? + "\n";
    fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

fn hf_config(g: &Gguf, arch: Arch, dtype: WeightDtype) -> Result<serde_json::Value> {
    let p = arch.prefix();
    let vocab = g.strings("tokenizer.ggml.tokens")?.len();
    let hidden = g.usize(&format!("{p}.embedding_length"))?;
    let heads = g.usize(&format!("{p}.attention.head_count"))?;
    let tied = !g.content.tensor_infos.contains_key("output.weight");
    let mut cfg = json!({
        "architectures": [match arch { Arch::Llama => "LlamaForCausalLM", Arch::Qwen2 => "Qwen2ForCausalLM" }],
        "model_type": p,
        "hidden_size": hidden,
        "intermediate_size": g.usize(&format!("{p}.feed_forward_length"))?,
        "num_hidden_layers": g.usize(&format!("{p}.block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": g.usize(&format!("{p}.attention.head_count_kv"))?,
        "head_dim": hidden / heads,
        "rms_norm_eps": g.f64(&format!("{p}.attention.layer_norm_rms_epsilon"))?,
        "rope_theta": g.f64(&format!("{p}.rope.freq_base")).unwrap_or(10_000.0),
        "max_position_embeddings": g.usize(&format!("{p}.context_length"))?,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": arch == Arch::Qwen2,
        "bos_token_id": g.usize("tokenizer.ggml.bos_token_id").ok(),
        "eos_token_id": g.usize("tokenizer.ggml.eos_token_id")?,
        "torch_dtype": torch_name(dtype)?,
    });
    if arch == Arch::Qwen2 {
        let m = cfg.as_object_mut().expect("object");
        m.insert("use_sliding_window".into(), json!(false));
        m.insert(
            "sliding_window".into(),
            m["max_position_embeddings"].clone(),
        );
        m.insert("max_window_layers".into(), m["num_hidden_layers"].clone());
    }
    Ok(cfg)
}

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Texts llama.cpp treats as end-of-generation tokens and therefore as
/// control tokens, even when the GGUF types them as normal (llama.cpp's
/// `llama_vocab::impl::load` overrides their type). Qwen2.5's vocabulary has
/// `</s>` as a normal token, which llama.cpp then never splits; we do the same
/// so token ids match llama.cpp's.
const LLAMA_CPP_EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
    "</s>",
];

/// Qwen2's pre-tokenizer regex (as in its HF tokenizer.json and llama.cpp).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Builds a byte-level BPE tokenizer from the GGUF vocabulary and merges.
fn build_tokenizer(g: &Gguf) -> Result<Tokenizer> {
    let model = g.string("tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!(
            "{}: tokenizer model '{model}' is not byte-level BPE (gpt2)",
            g.path.display()
        );
    }
    let tokens = g.strings("tokenizer.ggml.tokens")?;
    let types = g.ints("tokenizer.ggml.token_type")?;
    let merges = g.strings("tokenizer.ggml.merges")?;
    let pre = g.string("tokenizer.ggml.pre").unwrap_or_default();
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .with_context(|| format!("malformed merge '{m}'"))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| anyhow::anyhow!("building BPE model: {e}"))?;
    let pre_tokenizer: PreTokenizerWrapper = match pre.as_str() {
        "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        "qwen2" => Sequence::new(vec![
            Split::new(
                SplitPattern::Regex(QWEN2_PATTERN.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow::anyhow!("qwen2 regex: {e}"))?
            .into(),
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        other => bail!(
            "{}: unsupported pre-tokenizer '{other}' (smollm and qwen2 are supported)",
            g.path.display()
        ),
    };
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(tok, t)| {
            **t == TOKEN_TYPE_CONTROL
                || **t == TOKEN_TYPE_USER_DEFINED
                || LLAMA_CPP_EOG_TEXTS.contains(&tok.as_str())
        })
        .map(|(tok, _)| AddedToken::from(tok.clone(), true))
        .collect();
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| anyhow::anyhow!("adding special tokens: {e}"))?;
    Ok(tokenizer)
}

fn tokenizer_config(g: &Gguf) -> Result<serde_json::Value> {
    let tokens = g.strings("tokenizer.ggml.tokens")?;
    let name =
        |key: &str| -> Option<String> { g.usize(key).ok().and_then(|i| tokens.get(i).cloned()) };
    Ok(json!({
        "chat_template": g.string("tokenizer.chat_template").ok(),
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_bos_token": g.value("tokenizer.ggml.add_bos_token").ok().and_then(|v| v.to_bool().ok()).unwrap_or(false),
    }))
}

/// Maps a GGUF tensor name to its HF name.
pub(crate) fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Undoes llama.cpp's rotary permutation of q/k rows for `llama` GGUF files.
pub(crate) fn unpermute(w: &Tensor, n_head: usize) -> Result<Tensor> {
    let dims = w.dims().to_vec();
    let rows = dims[0];
    let rest: usize = dims[1..].iter().product();
    let t = w
        .reshape((n_head, rows / n_head / 2, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?;
    Ok(t)
}

fn write_weights(
    g: &Gguf,
    arch: Arch,
    config: &serde_json::Value,
    dtype: WeightDtype,
    path: &Path,
) -> Result<()> {
    let heads = config["num_attention_heads"].as_u64().unwrap_or(0) as usize;
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(0) as usize;
    let mut names: Vec<&String> = g.content.tensor_infos.keys().collect();
    names.sort();
    let bar = ProgressBar::new(names.len() as u64).with_style(
        ProgressStyle::with_template("convert [{bar:30}] {pos}/{len} tensors ({eta}) {msg}")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    for name in names {
        bar.set_message(name.clone());
        let Some(hf) = hf_name(name) else {
            log::debug!("skipping GGUF tensor {name} (no HF counterpart)");
            bar.inc(1);
            continue;
        };
        let mut t = g.tensor(name)?;
        if arch == Arch::Llama && t.rank() == 2 {
            if name.ends_with("attn_q.weight") {
                t = unpermute(&t, heads)?;
            } else if name.ends_with("attn_k.weight") {
                t = unpermute(&t, kv_heads)?;
            }
        }
        tensors.insert(hf, t.to_dtype(dtype.dtype())?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let tmp = path.with_extension("safetensors.partial");
    candle_core::safetensors::save(&tensors.into_iter().collect::<HashMap<_, _>>(), &tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path)?;
    Ok(())
}
