//! Reading selected rows of tensors out of a safetensors file with `pread`,
//! without mapping or reading the whole file (selective loading: the
//! neurons that are not selected never enter this process's memory).
//!
//! `safetensors::SafeTensors::read_metadata` wants the whole buffer, so the
//! 8-byte header length and the JSON header are parsed here directly.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Where a tensor lives in the file.
#[derive(Debug, Clone)]
pub(crate) struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the file (the end
    /// was checked against the file's size and the shape at open).
    pub start: u64,
}

/// An open safetensors file with its tensor index.
#[derive(Debug)]
pub(crate) struct RowReader {
    path: PathBuf,
    file: File,
    entries: HashMap<String, TensorEntry>,
    /// Bytes of tensor data read so far.
    read: std::sync::atomic::AtomicU64,
}

fn dtype_of(s: &str) -> Option<DType> {
    Some(match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        _ => return None,
    })
}

impl RowReader {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let size = file.metadata()?.len();
        let mut len = [0u8; 8];
        file.read_exact_at(&mut len, 0)
            .with_context(|| format!("{}: too short for a safetensors header", path.display()))?;
        let header_len = u64::from_le_bytes(len);
        if header_len > 100 << 20 || 8 + header_len > size {
            bail!(
                "{}: invalid safetensors header length {header_len}",
                path.display()
            );
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8)?;
        let json: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .with_context(|| format!("{}: malformed safetensors header", path.display()))?;
        let data_start = 8 + header_len;
        let mut entries = HashMap::new();
        for (name, v) in json {
            if name == "__metadata__" {
                continue;
            }
            let bad = || format!("{}: malformed header entry for {name}", path.display());
            let dtype_name = v["dtype"].as_str().with_context(bad)?;
            let Some(dtype) = dtype_of(dtype_name) else {
                continue; // not a weight matrix we read row-wise
            };
            let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).with_context(bad)?;
            let offs: [u64; 2] =
                serde_json::from_value(v["data_offsets"].clone()).with_context(bad)?;
            // No bytes to check against the file, yet the other dimension
            // sizes the row buffer a read allocates.
            if shape.contains(&0) {
                bail!(
                    "{}: tensor {name} has an empty dimension {shape:?}",
                    path.display()
                );
            }
            // Checked: a header's numbers must not wrap into agreement.
            let want = shape
                .iter()
                .try_fold(dtype.size_in_bytes() as u64, |n, &d| {
                    n.checked_mul(d as u64)
                });
            let span = data_start
                .checked_add(offs[0])
                .zip(data_start.checked_add(offs[1]));
            let Some((start, _end)) =
                span.filter(|&(s, e)| e <= size && s <= e && Some(e - s) == want)
            else {
                bail!("{}: tensor {name} has inconsistent offsets", path.display());
            };
            entries.insert(
                name,
                TensorEntry {
                    dtype,
                    shape,
                    start,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            entries,
            read: Default::default(),
        })
    }

    /// `pread` of tensor data, counted in [`RowSource::bytes_read`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.file.read_exact_at(buf, offset)
    }

    pub(crate) fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.entries
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", self.path.display()))
    }

    /// The matrix `name`'s entry and its `[rows, cols]`.
    fn matrix(&self, name: &str) -> Result<(&TensorEntry, usize, usize)> {
        let e = self.entry(name)?;
        let [n_rows, cols] = e.shape[..] else {
            bail!(
                "{}: {name} is not a matrix ({:?})",
                self.path.display(),
                e.shape
            );
        };
        Ok((e, n_rows, cols))
    }

    /// Rows `rows` (in that order) of the 2-D tensor `name` → `[rows.len(), cols]`
    /// in `dtype`. Consecutive rows are read with one `pread` (at most
    /// 4 MiB) and converted into the final buffer: no staging copy.
    #[cfg(test)]
    pub(crate) fn rows(&self, name: &str, rows: &[u32], dtype: DType) -> Result<Tensor> {
        let cols = self.matrix(name)?.2;
        let mut buf = RowBuf::new(dtype).with_context(|| name.to_string())?;
        buf.rows(self, name, rows)?;
        buf.into_tensor(cols)
    }

    /// Appends rows `rows` of `name`, converted to `T`, to `out`.
    fn append_rows<T: FromF32>(&self, name: &str, rows: &[u32], out: &mut Vec<T>) -> Result<()> {
        let (e, n_rows, cols) = self.matrix(name)?;
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n_rows) {
            bail!(
                "{}: row {bad} of {name} is out of range ({n_rows} rows)",
                self.path.display()
            );
        }
        let row_bytes = cols * e.dtype.size_in_bytes();
        let per_read = ((4 << 20) / row_bytes.max(1)).max(1);
        let mut buf = vec![0u8; per_read.min(rows.len()) * row_bytes];
        out.reserve(rows.len() * cols);
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && j - i < per_read && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            let bytes = &mut buf[..(j - i) * row_bytes];
            self.read_at(bytes, e.start + (rows[i] as usize * row_bytes) as u64)
                .with_context(|| format!("{}: reading rows of {name}", self.path.display()))?;
            convert(bytes, e.dtype, out);
            i = j;
        }
        Ok(())
    }

    /// Columns `cols` of the 2-D tensor `name`, transposed → `[cols.len(), rows]`
    /// in `dtype`. Reads the matrix one row at a time (a row-sized buffer),
    /// keeping only the selected columns, converted into the final buffer.
    #[cfg(test)]
    pub(crate) fn columns_t(&self, name: &str, cols: &[u32], dtype: DType) -> Result<Tensor> {
        let n_rows = self.matrix(name)?.1;
        let mut buf = RowBuf::new(dtype).with_context(|| name.to_string())?;
        buf.columns_t(self, name, cols)?;
        buf.into_tensor(n_rows)
    }

    fn append_columns_t<T: FromF32>(
        &self,
        name: &str,
        cols: &[u32],
        out: &mut Vec<T>,
    ) -> Result<()> {
        let (e, n_rows, n_cols) = self.matrix(name)?;
        if let Some(&c) = cols.iter().find(|&&c| c as usize >= n_cols) {
            bail!(
                "{}: column {c} of {name} is out of range ({n_cols} columns)",
                self.path.display()
            );
        }
        let elem = e.dtype.size_in_bytes();
        let mut row = vec![0u8; n_cols * elem];
        let mut converted: Vec<T> = Vec::with_capacity(n_cols);
        // out[c][r] = matrix[r][cols[c]]
        let base = out.len();
        out.resize(base + cols.len() * n_rows, T::from_f32(0.0));
        for r in 0..n_rows {
            self.read_at(&mut row, e.start + (r * n_cols * elem) as u64)
                .with_context(|| format!("{}: reading {name}", self.path.display()))?;
            converted.clear();
            convert(&row, e.dtype, &mut converted);
            for (c, &col) in cols.iter().enumerate() {
                out[base + c * n_rows + r] = converted[col as usize];
            }
        }
        Ok(())
    }
}

/// A growing buffer of weights in their final dtype: rows and columns of
/// several tensors can be read into one (`[gate rows; up rows]`) and
/// become a tensor without a copy.
pub(crate) enum RowBuf {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
}

impl RowBuf {
    pub(crate) fn new(dtype: DType) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => Self::F32(Vec::new()),
            DType::F16 => Self::F16(Vec::new()),
            DType::BF16 => Self::BF16(Vec::new()),
            other => bail!("cannot load weights as {other:?}"),
        })
    }

    /// Appends rows `rows` of `r`'s matrix `name`.
    pub(crate) fn rows(&mut self, r: &RowReader, name: &str, rows: &[u32]) -> Result<&mut Self> {
        match self {
            Self::F32(v) => r.append_rows(name, rows, v)?,
            Self::F16(v) => r.append_rows(name, rows, v)?,
            Self::BF16(v) => r.append_rows(name, rows, v)?,
        }
        Ok(self)
    }

    /// Appends columns `cols` of `r`'s matrix `name`, transposed.
    pub(crate) fn columns_t(
        &mut self,
        r: &RowReader,
        name: &str,
        cols: &[u32],
    ) -> Result<&mut Self> {
        match self {
            Self::F32(v) => r.append_columns_t(name, cols, v)?,
            Self::F16(v) => r.append_columns_t(name, cols, v)?,
            Self::BF16(v) => r.append_columns_t(name, cols, v)?,
        }
        Ok(self)
    }

    /// The buffer as a `[rows, cols]` CPU tensor (no copy).
    pub(crate) fn into_tensor(self, cols: usize) -> Result<Tensor> {
        let len = match &self {
            Self::F32(v) => v.len(),
            Self::F16(v) => v.len(),
            Self::BF16(v) => v.len(),
        };
        let shape = (len / cols.max(1), cols);
        Ok(match self {
            Self::F32(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            Self::F16(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            Self::BF16(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
        })
    }
}

/// Appends `bytes` (little-endian elements of `dtype`) to `out`, converted.
fn convert<T: FromF32>(bytes: &[u8], dtype: DType, out: &mut Vec<T>) {
    match dtype {
        DType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| T::from_f32(f32::from_le_bytes(b.try_into().expect("4 bytes")))),
        ),
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| T::from_f32(half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
        ),
        _ => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| T::from_f32(half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        ),
    }
}

/// Element types a whole tensor is read into ([`RowReader::tensor`]).
trait FromF32: Copy + candle_core::WithDType {
    fn from_f32(v: f32) -> Self;
}
impl FromF32 for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl FromF32 for half::f16 {
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}
impl FromF32 for half::bf16 {
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

impl RowReader {
    /// The whole tensor `name` in `dtype`, read with `pread` a few MiB at a
    /// time and converted into its final buffer: no mapping of the file and
    /// no second copy of the tensor while loading.
    pub(crate) fn tensor(&self, name: &str, dtype: DType) -> Result<Tensor> {
        fn read<T: FromF32>(r: &RowReader, name: &str, e: &TensorEntry) -> Result<Tensor> {
            let n: usize = e.shape.iter().product();
            let elem = e.dtype.size_in_bytes();
            let step = ((4 << 20) / elem).clamp(1, n.max(1));
            let mut buf = vec![0u8; step * elem];
            let mut out: Vec<T> = Vec::with_capacity(n);
            let mut at = 0;
            while at < n {
                let k = step.min(n - at);
                let bytes = &mut buf[..k * elem];
                r.read_at(bytes, e.start + (at * elem) as u64)
                    .with_context(|| format!("{}: reading {name}", r.path.display()))?;
                convert(bytes, e.dtype, &mut out);
                at += k;
            }
            Ok(Tensor::from_vec(out, e.shape.as_slice(), &Device::Cpu)?)
        }
        let e = self.entry(name)?;
        match dtype {
            DType::F32 => read::<f32>(self, name, e),
            DType::F16 => read::<half::f16>(self, name, e),
            DType::BF16 => read::<half::bf16>(self, name, e),
            other => bail!("{name}: cannot load weights as {other:?}"),
        }
    }
}

/// A [`candle_nn::VarBuilder`] backend reading whole tensors with `pread`
/// ([`RowReader::tensor`]): loading holds no mapping of the checkpoint
/// beside the loaded copies.
pub(crate) struct PreadTensors(pub std::sync::Arc<RowSource>);

impl candle_nn::var_builder::SimpleBackend for PreadTensors {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = self.get_unchecked(name, dtype, dev)?;
        if t.shape() != &s {
            candle_core::bail!(
                "{name} has shape {:?}, the model config expects {s:?}",
                t.dims()
            );
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self
            .0
            .find(name)
            .and_then(|r| r.tensor(name, dtype))
            .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
        t.to_device(dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.find(name).is_ok()
    }
}

/// The row readers of all safetensors files of a checkpoint.
#[derive(Debug)]
pub(crate) struct RowSource {
    readers: Vec<RowReader>,
}

impl RowSource {
    pub(crate) fn open(files: &[PathBuf]) -> Result<Self> {
        Ok(Self {
            readers: files
                .iter()
                .map(|f| RowReader::open(f))
                .collect::<Result<_>>()?,
        })
    }

    /// Drops the page cache of every file (`posix_fadvise(DONTNEED)`), so
    /// the next read goes to the disk again (a model whose FFN is streamed).
    pub(crate) fn drop_cached(&self) {
        use std::os::fd::AsRawFd;
        for r in &self.readers {
            // SAFETY: a valid open descriptor; the call only advises the kernel.
            unsafe {
                libc::posix_fadvise(r.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }

    /// Bytes of tensor data read from every file so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.readers
            .iter()
            .map(|r| r.read.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// Every tensor of the checkpoint, with where it lives.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (&str, &TensorEntry)> {
        self.readers
            .iter()
            .flat_map(|r| r.entries.iter().map(|(n, e)| (n.as_str(), e)))
    }

    /// The reader of the file holding `name`.
    pub(crate) fn find(&self, name: &str) -> Result<&RowReader> {
        self.readers
            .iter()
            .find(|r| r.entries.contains_key(name))
            .with_context(|| format!("no tensor {name} in the checkpoint"))
    }
}
