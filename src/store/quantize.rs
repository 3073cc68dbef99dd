//! Writes a model folder's quantized checkpoints (`model.q8.siq`,
//! `model.q4.siq`, format: [`crate::model::qfile`]) from its
//! `model.safetensors` (f32, the exactly dequantized GGUF) and, where the
//! folder keeps it, the GGUF it was converted from.
//!
//! What each dtype holds:
//! - `q8`: ggml's Q8_0 everywhere; a GGUF Q8_0 tensor keeps its blocks,
//!   a Q4_0 or Q5_0 one is widened to Q8_0 blocks with the same scales and
//!   the same weights ([`crate::kernels::quant::widen_to_q8_0`]), every
//!   other one (Q4_1, K-quants, f16/f32) is quantized from f32.
//! - `q4`: each tensor keeps its own GGUF blocks (Q4_0, Q4_1, Q5_0, Q8_0)
//!   bit for bit wherever the neuron-major layout keeps them: gate/up rows,
//!   attention rows (llama's rotary row permutation only moves whole rows),
//!   embeddings and lm_head. Any tensor whose GGUF type has no 32-block
//!   form here (K-quants, f16/f32) is requantized from f32 to the 32-block
//!   format of the same bits (Q4_x/Q4_K → Q4_1, Q5_x/Q5_K → Q5_0, Q6_K and
//!   wider → Q8_0); a folder without a GGUF (a synthetic model) gets Q4_1.
//! - `down_proj`, in both: Q8_0 neuron rows, requantized from f32. Its
//!   GGUF blocks run along the neurons while a bundle needs each neuron's
//!   column, and a block of 32 neurons cannot be split by selective
//!   loading, so no layout keeps them. Requantizing the columns to 4 bits
//!   cost ten times candle's GGUF model's KL on SmolLM2 (the columns run
//!   along the hidden size, whose outlier channels widen every block's
//!   range; Q5_0 was still 5× worse); Q8_0 matches it, at 8.5 bits per
//!   weight for a third of the FFN (docs/EXPERIMENTS.md, "Fidelity of the formats").
//!
//! Each tensor's provenance is recorded in the file's header.

use crate::kernels::quant::QFormat;
use crate::model::checkpoint::safetensors_files;
use crate::model::qfile::{self, Entry, FfnEntry, Header};
use crate::model::{weights_sha256, Config, Family};
use crate::store::convert;
use crate::sys::device::Quant;
use anyhow::{Context, Result};
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The 32-block format a GGUF type is kept as (`None`: it has none here).
fn kept(t: GgmlDType) -> Option<QFormat> {
    Some(match t {
        GgmlDType::Q4_0 => QFormat::Q4_0,
        GgmlDType::Q4_1 => QFormat::Q4_1,
        GgmlDType::Q5_0 => QFormat::Q5_0,
        GgmlDType::Q8_0 => QFormat::Q8_0,
        _ => return None,
    })
}

/// The format `q` requantizes a tensor of GGUF type `t` to.
fn target(q: Quant, t: Option<GgmlDType>) -> QFormat {
    use GgmlDType as G;
    match (q, t) {
        (Quant::Q8, _) => QFormat::Q8_0,
        (Quant::Q4, None) => QFormat::Q4_1,
        (Quant::Q4, Some(G::Q4_0)) => QFormat::Q4_0,
        (Quant::Q4, Some(G::Q4_1 | G::Q4K | G::Q3K | G::Q2K)) => QFormat::Q4_1,
        (Quant::Q4, Some(G::Q5_0 | G::Q5_1 | G::Q5K)) => QFormat::Q5_0,
        (Quant::Q4, Some(_)) => QFormat::Q8_0,
    }
}

/// Rows of `t` (`[rows, cols]`, f32) as blocks of `f`, by ggml's own code (candle's port).
fn quantize(t: &Tensor, f: QFormat) -> Result<Vec<u8>> {
    Ok(QTensor::quantize(
        &t.contiguous()?,
        f.ggml().with_context(|| format!("{f} has no ggml form"))?,
    )?
    .data()?
    .to_vec())
}

/// Where the tensors come from: the f32 checkpoint and, if kept, the GGUF.
struct Source {
    st: candle_core::safetensors::MmapedSafetensors,
    gguf: Option<(gguf_file::Content, std::fs::File, HashMap<String, String>)>,
    family: Family,
    heads: (usize, usize),
}

impl Source {
    fn f32(&self, name: &str) -> Result<Tensor> {
        Ok(self
            .st
            .load(name, &Device::Cpu)
            .with_context(|| format!("reading {name}"))?
            .to_dtype(DType::F32)?)
    }

    /// The GGUF type of HF tensor `name`, if the GGUF holds it.
    fn gguf_type(&self, name: &str) -> Option<GgmlDType> {
        let (content, _, names) = self.gguf.as_ref()?;
        Some(content.tensor_infos.get(names.get(name)?)?.ggml_dtype)
    }

    /// Tensor `name`'s raw GGUF blocks in HF row order, if `q` keeps them
    /// (q8 as they are or widened: [`Source::rows`]).
    fn kept_blocks(&mut self, name: &str, q: Quant) -> Result<Option<(QFormat, Vec<u8>)>> {
        let Some(f) = self.gguf_type(name).and_then(kept) else {
            return Ok(None);
        };
        // q8 keeps the blocks it can widen to Q8_0 exactly (`rows`); the
        // rest are requantized.
        if q == Quant::Q8 && !f.exact_in_q8_0() {
            return Ok(None);
        }
        let (content, file, names) = self.gguf.as_mut().expect("gguf_type found it");
        let qt = content.tensor(file, &names[name], &Device::Cpu)?;
        let data = qt.data()?.to_vec();
        // candle gives GGUF shapes in HF order: `[rows, cols]`.
        let dims = qt.shape().dims();
        let rows = qt.shape().elem_count() / dims.last().copied().unwrap_or(1).max(1);
        let n_head = if name.ends_with("q_proj.weight") {
            Some(self.heads.0)
        } else if name.ends_with("k_proj.weight") {
            Some(self.heads.1)
        } else {
            None
        };
        let data = match (self.family, n_head) {
            // llama.cpp stores llama's q/k rows permuted for its rotary
            // layout; the HF order is a permutation of whole rows.
            (Family::Llama, Some(n_head)) => {
                let idx = Tensor::arange(0u32, rows as u32, &Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .reshape((rows, 1))?;
                let perm: Vec<f32> = convert::unpermute(&idx, n_head)?.flatten_all()?.to_vec1()?;
                let rb = data.len() / rows;
                let mut out = Vec::with_capacity(data.len());
                for &src in &perm {
                    let s = src as usize * rb;
                    out.extend_from_slice(&data[s..s + rb]);
                }
                out
            }
            _ => data,
        };
        Ok(Some((f, data)))
    }

    /// Tensor `name` (2-D) as rows of blocks for `q`, and where they came from.
    fn rows(&mut self, name: &str, q: Quant) -> Result<(QFormat, Vec<u8>, String)> {
        if let Some((f, data)) = self.kept_blocks(name, q)? {
            let wide = QFormat::Q8_0;
            return Ok(if q == Quant::Q8 && f != wide {
                let data = crate::kernels::quant::widen_to_q8_0(f, &data).with_context(|| {
                    format!("{name}: GGUF {f} blocks have no exact {wide} form")
                })?;
                (
                    wide,
                    data,
                    format!("GGUF {f} blocks widened to {wide}, exactly"),
                )
            } else {
                (f, data, format!("GGUF {f} blocks kept"))
            });
        }
        let t = self.gguf_type(name);
        let f = target(q, t);
        let from = t.map_or("f32".to_string(), |t| format!("f32 (GGUF {t:?})"));
        Ok((
            f,
            quantize(&self.f32(name)?, f)?,
            format!("{f} from {from}"),
        ))
    }
}

/// True when `dir` has a quantized checkpoint `q` made from its current weights.
pub fn is_quantized(dir: &Path, q: Quant) -> bool {
    let path = dir.join(qfile::file_name(q.name()));
    let Ok(file) = qfile::QFile::open(&path) else {
        return false;
    };
    weights_sha256(dir).is_ok_and(|sha| file.header.weights_sha256 == sha)
}

/// Writes `dir/model.<q>.siq`; returns its path.
pub fn quantize_model(dir: &Path, q: Quant) -> Result<PathBuf> {
    let cfg = Config::from_file(&dir.join("config.json"))?;
    let files = safetensors_files(dir)?;
    // SAFETY: the files are not modified while mapped (we own the folder).
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files)? };
    let gguf_path = dir.join(crate::store::prepare::GGUF_FILE);
    let gguf = if gguf_path.is_file() {
        let mut f = std::fs::File::open(&gguf_path)
            .with_context(|| format!("opening {}", gguf_path.display()))?;
        let content = convert::read_gguf_header(&gguf_path, &mut f)?;
        let names = content
            .tensor_infos
            .keys()
            .filter_map(|g| convert::hf_name(g).map(|hf| (hf, g.clone())))
            .collect();
        Some((content, f, names))
    } else {
        None
    };
    let mut src = Source {
        st,
        gguf,
        family: cfg.family()?,
        heads: (cfg.num_attention_heads, cfg.num_kv_heads()),
    };
    let mut header = Header {
        dtype: q.name().to_string(),
        weights_sha256: weights_sha256(dir)?,
        provenance: BTreeMap::new(),
        tensors: BTreeMap::new(),
        ffn: Vec::new(),
    };
    let mut names: Vec<String> = src
        .st
        .tensors()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !n.contains(".mlp."))
        .collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let t = src.f32(&name)?;
        let (format, bytes) = if t.rank() == 1 {
            let v: Vec<f32> = t.to_vec1()?;
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            ("f32".to_string(), bytes)
        } else {
            let (f, bytes, from) = src.rows(&name, q)?;
            header.provenance.insert(name.clone(), from);
            (f.name().to_string(), bytes)
        };
        header.tensors.insert(
            name.clone(),
            Entry {
                format,
                shape: t.dims().to_vec(),
                offset: 0,
                bytes: 0,
            },
        );
        tensors.push((name, bytes));
    }
    let (h, n) = (cfg.hidden_size, cfg.intermediate_size);
    let mut ffn = Vec::new();
    for layer in 0..cfg.num_hidden_layers {
        let name = |p: &str| format!("model.layers.{layer}.mlp.{p}.weight");
        let (gf, gate, gfrom) = src.rows(&name("gate_proj"), q)?;
        let (uf, up, ufrom) = src.rows(&name("up_proj"), q)?;
        let down_name = name("down_proj");
        // Q8_0 for both dtypes: see the module docs.
        let df = QFormat::Q8_0;
        let down = quantize(&src.f32(&down_name)?.t()?, df)?;
        let from = src
            .gguf_type(&down_name)
            .map_or("f32".into(), |t| format!("f32 (GGUF {t:?})"));
        header.provenance.insert(name("gate_proj"), gfrom);
        header.provenance.insert(name("up_proj"), ufrom);
        header
            .provenance
            .insert(down_name, format!("{df} from {from}, as neuron rows"));
        let (gr, ur, dr) = (gf.row_bytes(h), uf.row_bytes(h), df.row_bytes(h));
        let mut bundles = Vec::with_capacity(n * (gr + ur + dr));
        for i in 0..n {
            bundles.extend_from_slice(&gate[i * gr..(i + 1) * gr]);
            bundles.extend_from_slice(&up[i * ur..(i + 1) * ur]);
            bundles.extend_from_slice(&down[i * dr..(i + 1) * dr]);
        }
        header.ffn.push(FfnEntry {
            neurons: n,
            hidden: h,
            gate: gf.name().into(),
            up: uf.name().into(),
            down: df.name().into(),
            offset: 0,
            bytes: 0,
        });
        ffn.push(bundles);
    }
    let path = dir.join(qfile::file_name(q.name()));
    qfile::write(&path, header, tensors, ffn)?;
    Ok(path)
}
