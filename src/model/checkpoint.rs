//! A checkpoint folder's weight files: listing them and their sha256 (what
//! files made from a model, such as rankings, are tied to), cached beside them.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// sha256 of a checkpoint's weight files (in name order), cached next to
/// them in `weights.sha256` keyed by size and modification time, so it is
/// computed once per prepared model rather than on every start.
pub fn weights_sha256(dir: &Path) -> Result<String> {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq)]
    struct Stamp {
        files: Vec<(String, u64, u128)>,
        sha256: String,
    }
    let cache = dir.join("weights.sha256");
    let cached = std::fs::read(&cache)
        .ok()
        .and_then(|b| serde_json::from_slice::<Stamp>(&b).ok());
    let files = match (safetensors_files(dir), &cached) {
        (Ok(files), _) => files,
        // A folder prepared for one quantized dtype keeps the hash of the
        // f32 checkpoint its `model.<q>.siq` was made from, not the file.
        (Err(_), Some(stamp)) => return Ok(stamp.sha256.clone()),
        (Err(e), None) => return Err(e),
    };
    let mut keys = Vec::new();
    for f in &files {
        let m = std::fs::metadata(f).with_context(|| format!("reading {}", f.display()))?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        keys.push((
            f.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string(),
            m.len(),
            mtime,
        ));
    }
    if let Some(stamp) = cached.filter(|s| s.files == keys) {
        return Ok(stamp.sha256);
    }
    let digests: Vec<String> = files
        .iter()
        .map(|f| sha256_file(f).map(|x| x.1))
        .collect::<Result<_>>()?;
    let sha256 = if digests.len() == 1 {
        digests[0].clone()
    } else {
        format!("{:x}", Sha256::digest(digests.join("\n").as_bytes()))
    };
    let stamp = Stamp {
        files: keys,
        sha256: sha256.clone(),
    };
    if let Err(e) = std::fs::write(&cache, serde_json::to_vec(&stamp)?) {
        log::debug!(
            "could not cache the weights hash in {}: {e}",
            cache.display()
        );
    }
    Ok(sha256)
}

/// The `*.safetensors` files of a checkpoint folder, sorted.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!(
            "no *.safetensors weights in {} (a catalog model prepared for one quantized dtype \
             keeps only its model.<q>.siq: `selectinfer prepare-model --all NAME` writes the \
             f32 checkpoint too)",
            dir.display()
        );
    }
    Ok(files)
}

/// Size and lowercase hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<(u64, String)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, format!("{:x}", hasher.finalize())))
}
