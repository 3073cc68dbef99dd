//! The quantized dtypes (`q8`, `q4`) on the real SmolLM2 weights: the
//! checkpoint file against `model.safetensors` (the exactly dequantized
//! GGUF), logits against f32, the file's refusals, and what a selective
//! load reads.

use super::common;

use crate::kernels::quant_mlp::DownForm;
use crate::model::qfile::{self, QFile};
use crate::model::{FfnRows, LoadOptions, Model};
use crate::sys::device::Quant;
use candle_core::{DType, Device, Tensor};
use std::path::{Path, PathBuf};

/// The SmolLM2 folder with both quantized files, written once per test
/// process (the tests run in parallel; two writers of one file raced).
pub(super) fn smollm2() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::model_dir("smollm2-135m-instruct");
        for q in [Quant::Q8, Quant::Q4] {
            if !crate::store::quantize::is_quantized(&dir, q) {
                crate::store::quantize::quantize_model(&dir, q).unwrap();
            }
        }
        dir
    })
    .clone()
}

fn f32_tensor(dir: &Path, name: &str) -> Vec<f32> {
    let st = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    st[name]
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn q4_keeps_the_gguf_blocks_bit_exact() {
    let dir = smollm2();
    let file = QFile::open(&dir.join(qfile::file_name("q4"))).unwrap();
    let kept: Vec<&String> = file
        .header
        .provenance
        .iter()
        .filter(|(_, p)| p.contains("kept"))
        .map(|(n, _)| n)
        .collect();
    // Attention (q/k permuted rows included), gate/up and the embedding.
    assert_eq!(kept.len(), 30 * 6 + 1, "{:?}", file.header.provenance);
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.7.self_attn.v_proj.weight",
        "model.layers.29.self_attn.o_proj.weight",
    ] {
        let e = &file.header.tensors[name];
        let (rows, cols) = (e.shape[0], e.shape[1]);
        let m = file.matrix(&[(name, rows)], cols).unwrap();
        let mut got = vec![0f32; rows * cols];
        m.dequantize_rows(0..rows, &mut got);
        assert!(
            got == f32_tensor(&dir, name),
            "{name} differs from the dequantized GGUF"
        );
    }
}

/// q8 widens a GGUF's Q4_0/Q5_0 blocks to Q8_0 exactly
/// (`kernels::quant::widen_to_q8_0`, tested there); SmolLM2's Q4_1 blocks
/// cannot be, so its q8 file requantizes them from f32 and says so.
#[test]
fn q8_requantizes_q4_1_tensors_and_keeps_q8_0_ones() {
    let dir = smollm2();
    let file = QFile::open(&dir.join(qfile::file_name("q8"))).unwrap();
    let p = &file.header.provenance;
    let count = |s: &str| p.values().filter(|v| v.contains(s)).count();
    assert_eq!(count("from f32 (GGUF Q4_1)"), 30 * 7, "{p:?}");
    assert_eq!(count("widened"), 0, "{p:?}");
    assert_eq!(p["model.embed_tokens.weight"], "GGUF q8_0 blocks kept");
}

pub(super) fn load(dir: &Path, quant: Option<Quant>, ffn: FfnRows) -> Model {
    Model::from_dir(
        dir,
        &LoadOptions {
            quant,
            ffn,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Softmax of logits.
fn probs(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::MIN, f32::max);
    let e: Vec<f64> = l.iter().map(|v| ((v - m) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (p, q) = (probs(p), probs(q));
    p.iter()
        .zip(&q)
        .map(|(a, b)| {
            if *a > 0.0 {
                a * (a / b.max(1e-30)).ln()
            } else {
                0.0
            }
        })
        .sum()
}

fn argmax(l: &[f32]) -> usize {
    l.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0
}

/// The fixture's cases: each chat prompt and the first 12 tokens of
/// llama.cpp's greedy reply to it (the teacher-forced steps).
pub(super) fn cases(fixture: &serde_json::Value) -> Vec<(Vec<u32>, Vec<u32>)> {
    (fixture["cases"].as_array().unwrap().iter())
        .map(|case| {
            let steps = common::ids(&case["generated_ids_no_stop"]);
            (
                common::ids(&case["prompt_ids"]),
                steps.into_iter().take(12).collect(),
            )
        })
        .collect()
}

/// Over positions: the summed KL(want ‖ got) and how many agree on top-1.
pub(super) fn compare(want: &[Vec<f32>], got: &[Vec<f32>]) -> (f64, usize) {
    want.iter().zip(got).fold((0.0, 0), |(k, a), (w, g)| {
        (k + kl(w, g), a + usize::from(argmax(w) == argmax(g)))
    })
}

/// Teacher-forced logits: the prompt (batched), then `steps` tokens one at a time.
pub(super) fn logits(m: &Model, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache();
    let mut out = vec![m.forward(prompt, &mut cache).unwrap().to_vec1().unwrap()];
    for &t in steps {
        out.push(m.forward(&[t], &mut cache).unwrap().to_vec1().unwrap());
    }
    out
}

/// Teacher-forced on a chat prompt and llama.cpp's greedy reply: per
/// position KL(f32 ‖ dtype) and top-1 agreement, for q8, q4 and candle's
/// quantized model on the GGUF (which reads the same blocks).
#[test]
fn quantized_logits_follow_f32_as_closely_as_the_gguf_model() {
    let dir = smollm2();
    let fixture = common::fixture("llamacpp_greedy_smollm2-135m-instruct.json");
    let f32m = load(&dir, None, FfnRows::All);
    let (q8, q4) = (
        load(&dir, Some(Quant::Q8), FfnRows::All),
        load(&dir, Some(Quant::Q4), FfnRows::All),
    );
    let (mut g, _) = crate::tools::gguf::QuantizedModel::load(&dir.join("model.gguf")).unwrap();
    let mut stats: [(f64, usize); 3] = [(0.0, 0); 3];
    let mut n = 0;
    for (prompt, steps) in cases(&fixture) {
        let want = logits(&f32m, &prompt, &steps);
        let mut gguf = Vec::new();
        let mut pos = 0;
        for ids in std::iter::once(prompt.clone()).chain(steps.iter().map(|&t| vec![t])) {
            gguf.push(g.forward(&ids, pos).unwrap().to_vec1::<f32>().unwrap());
            pos += ids.len();
        }
        for (k, got) in [
            logits(&q8, &prompt, &steps),
            logits(&q4, &prompt, &steps),
            gguf,
        ]
        .iter()
        .enumerate()
        {
            let (k_sum, agreed) = compare(&want, got);
            stats[k].0 += k_sum;
            stats[k].1 += agreed;
        }
        n += want.len();
    }
    let mean = |k: usize| stats[k].0 / n as f64;
    let agree = |k: usize| stats[k].1 as f64 / n as f64;
    eprintln!(
        "{n} positions: q8 KL {:.4} top-1 {:.3}; q4 KL {:.4} top-1 {:.3}; candle GGUF KL {:.4} top-1 {:.3}",
        mean(0), agree(0), mean(1), agree(1), mean(2), agree(2)
    );
    // Measured: q8 0.0036–0.0044 / 0.974, q4 0.0030–0.0035 / 0.974–1.0,
    // candle GGUF 0.0026 / 1.0 (q8 requantizes SmolLM2's Q4_1 values: two
    // roundings, not one). The range is the back ends': AVX2 gives the low
    // ends, AVX-512 and the portable loops the high ones. Their dots agree
    // to ~1e-6, but each decode step rounds the activations to 8 bits again,
    // and a last-digit difference that moves a value across a rounding
    // boundary moves the logits: decode logits of two back ends differ by
    // KL ~0.001 on these 39 positions (the dev-prompt fidelity runs of
    // docs/BENCHMARKS.md average over ~1,900 positions).
    // Prefill's products on 8-bit activations (`kernels::gemm_q`, as
    // llama.cpp's and candle's GGUF model's), down_proj's weights rounded
    // again to 8 bits per 32 neurons (stored neuron by neuron, so not in
    // its GGUF blocks): q4 0.0030–0.0035 → 0.0056 (top-1 0.974), q8
    // 0.0036–0.0044 → 0.0067 on AVX-512 VNNI, 2026-12-07. These 39
    // positions' KL moves by ±0.001 under last-digit changes (a product
    // changed by 3e-5 of its size moved q4's 0.0040 → 0.0050), so the
    // bars sit that far above; the sharp figure is the fidelity run over
    // 1,416 dev positions (q4 0.0044 with 8-bit activations in the
    // attention projections, 0.0039 with f32 ones: docs/EXPERIMENTS.md,
    // "Prefill on tiled 8-bit products").
    assert!(
        mean(1) <= 2.5 * mean(2),
        "q4's KL {} is above the GGUF model's {}",
        mean(1),
        mean(2)
    );
    assert!(
        agree(1) >= agree(2) - 0.03,
        "q4's top-1 {} is below the GGUF model's {}",
        agree(1),
        agree(2)
    );
    assert!(
        mean(0) <= 3.0 * mean(2) && agree(0) >= 0.95,
        "q8: KL {} top-1 {}",
        mean(0),
        agree(0)
    );
}

#[test]
fn a_truncated_or_foreign_quantized_file_is_refused_with_a_clear_error() {
    let dir = smollm2();
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "weights.sha256",
    ] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    std::os::unix::fs::symlink(
        dir.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let q4 = std::fs::read(dir.join(qfile::file_name("q4"))).unwrap();
    let path = tmp.path().join(qfile::file_name("q4"));
    let opts = LoadOptions {
        quant: Some(Quant::Q4),
        ..Default::default()
    };
    let err = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        format!("{:#}", Model::from_dir(tmp.path(), &opts).unwrap_err())
    };
    let e = err(&q4[..q4.len() - 1000]);
    assert!(e.contains("is truncated") && e.contains("layer 29"), "{e}");
    let e = err(&q4[..100]);
    assert!(e.contains("truncated or corrupt header"), "{e}");
    let e = err(b"not a checkpoint at all");
    assert!(e.contains("not a quantized checkpoint"), "{e}");
    std::fs::remove_file(&path).unwrap();
    let e = format!("{:#}", Model::from_dir(tmp.path(), &opts).unwrap_err());
    assert!(e.contains("selectinfer quantize"), "{e}");
    // Made from other weights: the Qwen file beside SmolLM2's checkpoint.
    let qwen = common::model_dir("qwen2.5-coder-0.5b-instruct");
    if !crate::store::quantize::is_quantized(&qwen, Quant::Q4) {
        crate::store::quantize::quantize_model(&qwen, Quant::Q4).unwrap();
    }
    std::os::unix::fs::symlink(qwen.join(qfile::file_name("q4")), &path).unwrap();
    let e = format!("{:#}", Model::from_dir(tmp.path(), &opts).unwrap_err());
    assert!(e.contains("made from other weights"), "{e}");
}

#[test]
fn selective_loading_of_bundles_reads_exactly_the_planned_neurons() {
    let dir = smollm2();
    for q in ["q8", "q4"] {
        let file = QFile::open(&dir.join(qfile::file_name(q))).unwrap();
        let bb = file.header.ffn[3].layout().unwrap().bundle_bytes() as u64;
        // Three runs of consecutive neurons.
        let ids: Vec<u32> = (10..50).chain(51..52).chain(700..1536).collect();
        let (bytes, reads) = (file.bytes_read(), file.reads());
        let b = file.bundles(3, Some(&ids)).unwrap();
        assert_eq!(b.len(), ids.len());
        assert_eq!(file.bytes_read() - bytes, ids.len() as u64 * bb);
        assert_eq!(
            file.reads() - reads,
            3,
            "one pread per run of consecutive neurons"
        );
        // q8 keeps its down rows exact; q4 stores them in quads where
        // those kernels run.
        let quads = q == "q4" && crate::kernels::quads::preferred();
        let form = if quads {
            DownForm::Quads
        } else {
            DownForm::Rows
        };
        assert_eq!(b.layout().down_form, form, "{q}");
        assert!(file.bundles(3, Some(&[5, 4])).is_err());
        assert!(file.bundles(3, Some(&[1536])).is_err());
        // The held bundles are the file's: the dense load's rows `ids`.
        let all = file.bundles(3, None).unwrap();
        let x: Vec<f32> = (0..576).map(|i| ((i % 11) as f32 - 5.0) * 0.05).collect();
        let sub = crate::model::Mlp::from_bundles(b, Some(ids.clone())).unwrap();
        let dense = crate::model::Mlp::from_bundles(all, None).unwrap();
        let t = Tensor::from_slice(&x, (1, 1, 576), &Device::Cpu).unwrap();
        let a_all: Vec<f32> = dense
            .activations(&t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let a_sub: Vec<f32> = sub
            .activations(&t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // The same rows; only the prefill matmul's chunking differs.
        for (k, &id) in ids.iter().enumerate() {
            let (a, b) = (a_sub[k], a_all[id as usize]);
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "neuron {id}: {a} vs {b}"
            );
        }
    }
}

/// γ-loading on q4 answers as f32 does; selective computation on it reads
/// fewer bytes per token still (its accuracy is the method's, not the
/// format's: docs/BENCHMARKS.md).
#[test]
fn selective_modes_run_on_q4() {
    let dir = smollm2();
    let run = |mode| {
        let spec = crate::engine::EngineSpec {
            model: dir.clone(),
            dtype: crate::sys::device::WeightDtype::Q4,
            mode,
            ranking: Some(
                common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"),
            ),
            ..crate::engine::EngineSpec::default()
        };
        let mut engine = spec.load().unwrap();
        let opts = crate::engine::GenerateOptions {
            max_new_tokens: 12,
            ..Default::default()
        };
        let g = engine
            .generate_chat("What is the capital of France?", &opts, |_| true)
            .unwrap();
        // A second prompt re-arranges the same held rows.
        engine
            .generate_chat("Name a primary color.", &opts, |_| true)
            .unwrap();
        (engine.model.decode_weight_bytes(), g)
    };
    let dense = load(&dir, Some(Quant::Q4), FfnRows::All).decode_weight_bytes();
    let (held, load_only) = run(crate::method::Mode::LoadOnly);
    assert!(held < dense);
    assert!(load_only.text.contains("Paris"), "{:?}", load_only.text);
    let (_, sel) = run(crate::method::Mode::Selectinfer);
    assert!(
        sel.decode_weight_bytes < load_only.decode_weight_bytes,
        "{} vs {}",
        sel.decode_weight_bytes,
        load_only.decode_weight_bytes
    );
}

/// Qwen2.5-Coder-0.5B's q4 checkpoint (written if missing), its config.
fn qwen_q4() -> (PathBuf, crate::model::Config, std::sync::Arc<QFile>) {
    let qwen = common::model_dir("qwen2.5-coder-0.5b-instruct");
    if !crate::store::quantize::is_quantized(&qwen, Quant::Q4) {
        crate::store::quantize::quantize_model(&qwen, Quant::Q4).unwrap();
    }
    let cfg = crate::model::Config::from_file(&qwen.join("config.json")).unwrap();
    let file = std::sync::Arc::new(QFile::open(&qwen.join(qfile::file_name("q4"))).unwrap());
    (qwen, cfg, file)
}

#[test]
fn embedding_rows_read_from_the_file_are_the_held_tables_rows() {
    use crate::model::embedding::Embedding;
    use crate::model::file_rows::{self, FileRows};
    use crate::model::linear::{Linear, Weights};
    // Qwen's lm_head is a matrix of its own, so its q4 table stays in the
    // file; read there, a row is the same bits as the held table's (whose
    // rows may be planar).
    let (qwen, cfg, file) = qwen_q4();
    let table = file_rows::EMBEDDING;
    assert!(file_rows::stays_in_file(table, &cfg, false));
    assert!(!file_rows::stays_in_file(file_rows::HEAD, &cfg, false));
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let disk = Embedding::InFile(FileRows::open(file.clone(), table, v, h).unwrap());
    let held = Embedding::Held(
        Linear::with_weights(Weights::Quant(file.matrix(&[(table, v)], h).unwrap()), None).unwrap(),
    );
    let ids = [0, 1, v as u32 - 1, 42, 42, 9000];
    let bits =
        |e: &Embedding| -> Vec<u32> { e.rows(&ids).unwrap().iter().map(|x| x.to_bits()).collect() };
    assert_eq!(bits(&disk), bits(&held));
    let e = format!("{:#}", disk.rows(&[3, v as u32]).unwrap_err());
    assert!(
        e.contains(&format!("token id {v}")) && e.contains(table),
        "{e}"
    );
    // The loaded model's footprint leaves the table out, and the lm_head
    // too where it stays in the file.
    for head_in_file in [false, true] {
        let opts = LoadOptions {
            quant: Some(Quant::Q4),
            head_in_file,
            ..LoadOptions::default()
        };
        let f = crate::model::footprint::Footprint::of(&qwen, &opts).unwrap();
        let bytes = |name: &str| file.header.tensors[name].bytes;
        let all: u64 = file.header.tensors.values().map(|e| e.bytes).sum();
        let head = if head_in_file {
            bytes(file_rows::HEAD)
        } else {
            0
        };
        assert_eq!(f.other_weights, all - bytes(table) - head);
    }
}

#[test]
fn lm_head_rows_read_from_the_file_are_the_held_heads_bits() {
    use crate::kernels::test_data::data;
    use crate::model::file_rows::{self, FileRows};
    use crate::model::head_screen::{HeadScreen, ScreenBits};
    use crate::model::linear::{Linear, Weights};
    use crate::model::lm_head::LmHead;
    use crate::model::vocab::OutputVocab;
    let (_, cfg, file) = qwen_q4();
    let (v, h, name) = (cfg.vocab_size, cfg.hidden_size, file_rows::HEAD);
    let held = LmHead::Held(
        Linear::with_weights(Weights::Quant(file.matrix(&[(name, v)], h).unwrap()), None).unwrap(),
    );
    let disk = LmHead::InFile(FileRows::open(file.clone(), name, v, h).unwrap());
    let bits = |y: Vec<f32>| -> Vec<u32> { y.iter().map(|x| x.to_bits()).collect() };
    let x: Vec<f32> = data(h, 5).iter().map(|x| 4.0 * x).collect();
    assert_eq!(
        bits(disk.forward_row(&x).unwrap()),
        bits(held.forward_row(&x).unwrap())
    );
    let ids = [0, 1, 2, 700, 701, 9000, v as u32 - 1];
    assert_eq!(
        bits(disk.forward_row_ids(&x, &ids).unwrap()),
        bits(held.forward_row_ids(&x, &ids).unwrap())
    );
    let vocab = OutputVocab::new(v, 100_000, vec![120_000, v as u32 - 1]).unwrap();
    assert_eq!(
        bits(disk.forward_row_subset(&x, &vocab).unwrap()),
        bits(held.forward_row_subset(&x, &vocab).unwrap())
    );
    // Many positions: the rows read a chunk at a time, each chunk as a
    // held matrix computes it.
    let xs = Tensor::from_vec(data(3 * h, 9), (1, 3, h), &Device::Cpu).unwrap();
    let all = |head: &LmHead| {
        let y = head.forward(&xs).unwrap();
        assert_eq!(y.dims(), [1, 3, v]);
        bits(y.flatten_all().unwrap().to_vec1::<f32>().unwrap())
    };
    assert_eq!(all(&disk), all(&held));
    // A screen built from the file is the held head's screen.
    for (k, b) in [(64, ScreenBits::Four), (256, ScreenBits::Two)] {
        let from_disk = HeadScreen::build(&disk, k, b, None).unwrap();
        let from_held = HeadScreen::build(&held, k, b, None).unwrap();
        assert_eq!(
            bits(from_disk.logits(&disk, &x, Some(&vocab)).unwrap()),
            bits(from_held.logits(&held, &x, Some(&vocab)).unwrap())
        );
    }
    let e = format!(
        "{:#}",
        disk.forward_row_ids(&x, &[3, v as u32]).unwrap_err()
    );
    assert!(e.contains(&format!("row {v}")) && e.contains(name), "{e}");
}

#[test]
fn a_model_with_its_lm_head_in_the_file_gives_the_held_heads_logits() {
    use crate::model::ScreenBits;
    let (qwen, _, _) = qwen_q4();
    let open = |head_in_file| {
        Model::from_dir(
            &qwen,
            &LoadOptions {
                quant: Some(Quant::Q4),
                head_in_file,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (mut held, mut disk) = (open(false), open(true));
    let (prompt, steps) = ([9707u32, 11, 1879, 0, 358, 1079], [264u32, 1614, 13]);
    let bits = |l: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        l.iter()
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    // Behind the screen (the prompt's last row, then decode steps), and
    // without it (a grammar's steps: every row, read from the file).
    for bits_of_copy in [Some(ScreenBits::Two), None] {
        for m in [&mut held, &mut disk] {
            let s = bits_of_copy.map(|b| m.build_head_screen(256, b, None).unwrap());
            m.set_head_screen(s).unwrap();
        }
        assert_eq!(
            bits(logits(&disk, &prompt, &steps)),
            bits(logits(&held, &prompt, &steps)),
            "screen {bits_of_copy:?}"
        );
    }
}
