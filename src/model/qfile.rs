//! The quantized checkpoint file (`model.q4.siq`, `model.q8.siq`) that the
//! `q4`/`q8` dtypes load: every tensor as rows of ggml blocks (norms and
//! biases as f32), and each layer's FFN as *neuron bundles* — neuron `n`'s
//! gate row, up row and down row (its column of `down_proj`) one after
//! another ([`crate::kernels::quant_mlp::BundleLayout`]) — so selective
//! loading reads each run of consecutive chosen neurons with one `pread`,
//! straight into the buffer decode runs on (no staging copy, no mapping).
//!
//! Layout: the magic `SIQUANT1`, the header's length (u64, little
//! endian), the JSON [`Header`], zeros up to a multiple of 4096, then the
//! data; every offset in the header counts from the start of the data.
//! `store::quantize` writes it (from the GGUF the model was converted
//! from); [`QFile::open`] refuses a truncated or inconsistent file and
//! [`QFile::check`] one made from other weights or for another shape.

use crate::kernels::planar::RowForm;
use crate::kernels::quant::QFormat;
use crate::kernels::quant_mlp::{BundleLayout, DownForm};
use crate::model::bundles::Bundles;
use crate::model::linear::QMatrix;
use crate::model::Config;
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const MAGIC: &[u8; 8] = b"SIQUANT1";
/// Data starts at a multiple of this.
pub(crate) const ALIGN: u64 = 4096;

/// The file of a quantized dtype (`q4`, `q8`) in a model folder.
pub(crate) fn file_name(dtype: &str) -> String {
    format!("model.{dtype}.siq")
}

/// A tensor: `format` is a block format's name or `f32`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Entry {
    pub format: String,
    pub shape: Vec<usize>,
    pub offset: u64,
    pub bytes: u64,
}

/// One layer's neuron bundles.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct FfnEntry {
    pub neurons: usize,
    pub hidden: usize,
    pub gate: String,
    pub up: String,
    pub down: String,
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Header {
    /// `q4` or `q8`.
    pub dtype: String,
    /// [`crate::model::weights_sha256`] of the checkpoint it was made beside.
    pub weights_sha256: String,
    /// What each tensor was made from (for the record: kept blocks or requantized).
    pub provenance: BTreeMap<String, String>,
    pub tensors: BTreeMap<String, Entry>,
    pub ffn: Vec<FfnEntry>,
}

impl FfnEntry {
    pub(crate) fn layout(&self) -> Result<BundleLayout> {
        let f = |s: &str| s.parse::<QFormat>();
        let l = BundleLayout {
            hidden: self.hidden,
            gate: f(&self.gate)?,
            up: f(&self.up)?,
            down: f(&self.down)?,
            rows: RowForm::Blocks,
            down_form: DownForm::Rows,
        };
        l.check()?;
        Ok(l)
    }
}

/// Bytes of a tensor of `shape` in `format`.
fn tensor_bytes(format: &str, shape: &[usize]) -> Result<u64> {
    let too_large = || anyhow::anyhow!("shape {shape:?} is too large");
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(too_large)?;
    if format == "f32" {
        return n.checked_mul(4).map(|b| b as u64).ok_or_else(too_large);
    }
    let f: QFormat = format.parse()?;
    let cols = *shape.last().context("a tensor with no dimensions")?;
    if !cols.is_multiple_of(crate::kernels::quant::QK) {
        bail!(
            "rows of {cols} cannot be blocks of {}",
            crate::kernels::quant::QK
        );
    }
    (cols / crate::kernels::quant::QK)
        .checked_mul(f.block_bytes())
        .and_then(|row| row.checked_mul(n / cols.max(1)))
        .map(|b| b as u64)
        .ok_or_else(too_large)
}

/// Writes a quantized checkpoint: `header` (offsets and sizes filled in
/// here, in the order given) and each item's bytes.
pub(crate) fn write(
    path: &Path,
    mut header: Header,
    tensors: Vec<(String, Vec<u8>)>,
    ffn: Vec<Vec<u8>>,
) -> Result<()> {
    let mut at = 0u64;
    for (name, bytes) in &tensors {
        let e = header
            .tensors
            .get_mut(name)
            .with_context(|| format!("no header entry for {name}"))?;
        (e.offset, e.bytes) = (at, bytes.len() as u64);
        at += bytes.len() as u64;
    }
    for (e, bytes) in header.ffn.iter_mut().zip(&ffn) {
        (e.offset, e.bytes) = (at, bytes.len() as u64);
        at += bytes.len() as u64;
    }
    let json = serde_json::to_vec(&header)?;
    let head = 16 + json.len() as u64;
    let pad = head.next_multiple_of(ALIGN) - head;
    let tmp = path.with_extension("siq.partial");
    let mut w = std::io::BufWriter::new(
        File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
    );
    use std::io::Write;
    w.write_all(MAGIC)?;
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(&json)?;
    w.write_all(&vec![0u8; pad as usize])?;
    for b in tensors.iter().map(|t| &t.1).chain(&ffn) {
        w.write_all(b)?;
    }
    w.into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", tmp.display()))?
        .sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// An open quantized checkpoint.
#[derive(Debug)]
pub(crate) struct QFile {
    path: PathBuf,
    file: File,
    pub header: Header,
    data_start: u64,
    /// Bytes of weights read so far (what a selective load costs).
    read: AtomicU64,
    /// `pread` calls so far.
    reads: AtomicU64,
}

impl QFile {
    /// Opens `path`, checking that every entry is consistent and inside the file.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| {
            format!(
                "opening {} (the q8/q4 dtypes need it: run `selectinfer prepare-model` or `selectinfer quantize`)",
                path.display()
            )
        })?;
        let size = file.metadata()?.len();
        let mut head = [0u8; 16];
        file.read_exact_at(&mut head, 0)
            .ok()
            .filter(|_| &head[..8] == MAGIC)
            .with_context(|| {
                format!(
                    "{} is not a quantized checkpoint (no {:?} magic)",
                    path.display(),
                    std::str::from_utf8(MAGIC).unwrap_or_default()
                )
            })?;
        let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
        if len > 64 << 20 || 16 + len > size {
            bail!(
                "{}: truncated or corrupt header (length {len}, file {size} bytes)",
                path.display()
            );
        }
        let mut json = vec![0u8; len as usize];
        file.read_exact_at(&mut json, 16)?;
        let header: Header = serde_json::from_slice(&json)
            .with_context(|| format!("{}: malformed header", path.display()))?;
        let data_start = (16 + len).next_multiple_of(ALIGN);
        let check = |what: &str, offset: u64, bytes: u64, want: u64| -> Result<()> {
            if bytes != want {
                bail!(
                    "{}: {what} has {bytes} bytes, its shape and format need {want}",
                    path.display()
                );
            }
            let end = data_start
                .checked_add(offset)
                .and_then(|e| e.checked_add(bytes));
            if end.is_none_or(|end| end > size) {
                bail!(
                    "{} is truncated: {what} ends at byte {data_start} + {offset} + {bytes}, the file has {size} (re-run `selectinfer quantize`)",
                    path.display()
                );
            }
            Ok(())
        };
        for (name, e) in &header.tensors {
            let want = tensor_bytes(&e.format, &e.shape)
                .with_context(|| format!("{}: tensor {name}", path.display()))?;
            check(name, e.offset, e.bytes, want)?;
        }
        for (i, e) in header.ffn.iter().enumerate() {
            let l = e
                .layout()
                .with_context(|| format!("{}: layer {i}'s bundles", path.display()))?;
            let want = l
                .bundle_bytes()
                .checked_mul(e.neurons)
                .with_context(|| format!("{}: layer {i} has too many neurons", path.display()))?;
            check(
                &format!("layer {i}'s bundles"),
                e.offset,
                e.bytes,
                want as u64,
            )?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            header,
            data_start,
            read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        })
    }

    /// Refuses a file made from other weights, or for another model shape.
    pub(crate) fn check(&self, cfg: &Config, weights_sha256: &str) -> Result<()> {
        let p = self.path.display();
        if self.header.weights_sha256 != weights_sha256 {
            bail!(
                "{p} was made from other weights (sha256 {}, this checkpoint {weights_sha256}): re-run `selectinfer quantize`",
                self.header.weights_sha256
            );
        }
        if self.header.ffn.len() != cfg.num_hidden_layers {
            bail!(
                "{p} has {} layers of bundles, the model {}",
                self.header.ffn.len(),
                cfg.num_hidden_layers
            );
        }
        for (i, e) in self.header.ffn.iter().enumerate() {
            if (e.neurons, e.hidden) != (cfg.intermediate_size, cfg.hidden_size) {
                bail!(
                    "{p}: layer {i} has {} neurons of {}, the model {} of {}",
                    e.neurons,
                    e.hidden,
                    cfg.intermediate_size,
                    cfg.hidden_size
                );
            }
        }
        Ok(())
    }

    /// Bytes of weights read so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// `pread` calls so far.
    #[cfg(test)]
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.header
            .tensors
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", self.path.display()))
    }

    fn read_into(&self, buf: &mut [u8], offset: u64, what: &str) -> Result<()> {
        self.file
            .read_exact_at(buf, self.data_start + offset)
            .with_context(|| format!("{}: reading {what}", self.path.display()))?;
        self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The block format of tensor `name`, checked to be `[rows, cols]` of
    /// one format in whole blocks (read whole by [`QFile::matrix`], or a row
    /// at a time by [`QFile::read_rows`]).
    pub(crate) fn row_format(&self, name: &str, rows: usize, cols: usize) -> Result<QFormat> {
        let e = self.entry(name)?;
        if e.shape != [rows, cols] || !cols.is_multiple_of(crate::kernels::quant::QK) {
            bail!(
                "{}: {name} has shape {:?}, the model config expects [{rows}, {cols}] (whole blocks of {})",
                self.path.display(),
                e.shape,
                crate::kernels::quant::QK
            );
        }
        let f: QFormat =
            (e.format.parse()).with_context(|| format!("{}: {name}", self.path.display()))?;
        if e.bytes != (f.row_bytes(cols) * rows) as u64 {
            bail!(
                "{}: {name} holds {} bytes, not {rows} rows of {f:?}",
                self.path.display(),
                e.bytes
            );
        }
        Ok(f)
    }

    /// Rows `first..` of tensor `name` (of [`QFile::row_format`]'s checked
    /// shape, rows of `row_bytes`) into `buf`, whole rows in whole blocks.
    /// Not counted in [`QFile::bytes_read`] (a lookup at run time, not a
    /// load).
    pub(crate) fn read_rows(
        &self,
        name: &str,
        first: usize,
        row_bytes: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        let e = self.entry(name)?;
        let at = e.offset + (first * row_bytes) as u64;
        if row_bytes == 0
            || !buf.len().is_multiple_of(row_bytes)
            || at + buf.len() as u64 > e.offset + e.bytes
        {
            bail!(
                "{}: {} bytes from row {first} of {name} (rows of {row_bytes}) are not whole rows within its {} bytes",
                self.path.display(),
                buf.len(),
                e.bytes
            );
        }
        self.file
            .read_exact_at(buf, self.data_start + at)
            .with_context(|| {
                format!(
                    "{}: reading rows from {first} of {name}",
                    self.path.display()
                )
            })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A 1-D f32 tensor (a norm's weight, a bias).
    pub(crate) fn f32(&self, name: &str, len: usize) -> Result<Tensor> {
        let e = self.entry(name)?;
        if e.format != "f32" || e.shape != [len] {
            bail!(
                "{}: {name} is {} {:?}, expected f32 [{len}]",
                self.path.display(),
                e.format,
                e.shape
            );
        }
        let mut b = vec![0u8; e.bytes as usize];
        self.read_into(&mut b, e.offset, name)?;
        let v: Vec<f32> = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(Tensor::from_vec(v, len, &Device::Cpu)?)
    }

    /// Matrices `names` (each `[rows, cols]`, `cols` shared) as one
    /// quantized matrix, their rows one after another.
    pub(crate) fn matrix(&self, names: &[(&str, usize)], cols: usize) -> Result<QMatrix> {
        let mut parts = Vec::new();
        let mut total = 0;
        for &(name, rows) in names {
            parts.push((self.row_format(name, rows, cols)?, rows));
            total += self.entry(name)?.bytes as usize;
        }
        let mut data = vec![0u8; total];
        let mut at = 0;
        for &(name, _) in names {
            let e = self.entry(name)?;
            self.read_into(&mut data[at..at + e.bytes as usize], e.offset, name)?;
            at += e.bytes as usize;
        }
        QMatrix::new(cols, parts, data)
            .with_context(|| format!("{}: {names:?}", self.path.display()))
    }

    /// Layer `layer`'s bundles of neurons `ids` (ascending; `None`: all),
    /// each run of consecutive ids read with one `pread`.
    pub(crate) fn bundles(&self, layer: usize, ids: Option<&[u32]>) -> Result<Bundles> {
        let (layout, data) = self.raw_bundles(layer, ids)?;
        // `q8` keeps its down rows whole: it is the dtype closest to f32,
        // and the quads round each block's four coefficients to 8 bits.
        Bundles::new_in(layout, data, self.header.dtype != "q8")
    }

    /// Layer `layer`'s bundles of neurons `ids` (ascending; `None`: all)
    /// as the file holds them (whole blocks, whole bundles), with their layout.
    pub(crate) fn raw_bundles(
        &self,
        layer: usize,
        ids: Option<&[u32]>,
    ) -> Result<(BundleLayout, Vec<u8>)> {
        let e =
            self.header.ffn.get(layer).with_context(|| {
                format!("{}: no bundles for layer {layer}", self.path.display())
            })?;
        let layout = e.layout()?;
        let bb = layout.bundle_bytes();
        let what = format!("layer {layer}'s neuron bundles");
        let data = match ids {
            None => {
                let mut data = vec![0u8; e.bytes as usize];
                self.read_into(&mut data, e.offset, &what)?;
                data
            }
            Some(ids) => {
                if let Some(&bad) = ids.iter().find(|&&i| i as usize >= e.neurons) {
                    bail!(
                        "{}: neuron {bad} of layer {layer}, which has {}",
                        self.path.display(),
                        e.neurons
                    );
                }
                if ids.windows(2).any(|w| w[0] >= w[1]) {
                    bail!("neurons to load must be ascending without duplicates");
                }
                let mut data = vec![0u8; ids.len() * bb];
                let mut i = 0;
                while i < ids.len() {
                    let mut j = i + 1;
                    while j < ids.len() && ids[j] == ids[j - 1] + 1 {
                        j += 1;
                    }
                    let off = e.offset + ids[i] as u64 * bb as u64;
                    self.read_into(&mut data[i * bb..j * bb], off, &what)?;
                    i = j;
                }
                data
            }
        };
        Ok((layout, data))
    }
}
