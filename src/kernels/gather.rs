//! Gathering rows of a weight matrix into a new buffer (the per-prompt
//! arrangement of the chosen neurons).

use candle_core::{CpuStorage, Result, Storage, Tensor};

/// Rows `rows` of a 2-D tensor as a new contiguous tensor. On CPU this is a
/// plain row-by-row memcpy (candle's `index_select` goes element by element
/// and is ~10x slower); elsewhere it is `index_select`.
pub fn gather_rows(t: &Tensor, rows: &[u32]) -> Result<Tensor> {
    let (n, k) = t.dims2()?;
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
        candle_core::bail!("gather_rows: row {bad} out of range ({n} rows)");
    }
    if !t.device().is_cpu() || !t.is_contiguous() {
        let idx = Tensor::new(rows, t.device())?;
        return t.index_select(&idx, 0);
    }
    /// Copies the rows in parallel into a fresh buffer that asks for huge
    /// pages: the copy is once per prompt and page faults dominated it.
    fn gather<T: Copy + Send + Sync>(src: &[T], k: usize, rows: &[u32]) -> Vec<T> {
        use rayon::prelude::*;
        let len = rows.len() * k;
        let mut out: Vec<T> = Vec::with_capacity(len);
        if len == 0 {
            return out;
        }
        crate::sys::hugepages::advise(out.as_ptr().cast(), len * std::mem::size_of::<T>());
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(k)
            .zip(rows.par_iter())
            .with_min_len(16)
            .for_each(|(dst, &r)| {
                let row = &src[r as usize * k..(r as usize + 1) * k];
                // SAFETY: `dst` and `row` both hold `k` elements of `T: Copy`
                // and do not overlap (`dst` is in the new buffer).
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst.as_mut_ptr().cast(), k) };
            });
        // SAFETY: every one of the `len` elements was written above.
        unsafe { out.set_len(len) };
        out
    }
    let (storage, layout) = t.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("gather_rows: tensor is not contiguous");
    };
    let shape = (rows.len(), k);
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => {
            Tensor::from_vec(gather(&v[start..end], k, rows), shape, t.device())
        }
        Storage::Cpu(CpuStorage::F16(v)) => {
            Tensor::from_vec(gather(&v[start..end], k, rows), shape, t.device())
        }
        _ => {
            drop(storage);
            t.index_select(&Tensor::new(rows, t.device())?, 0)
        }
    }
}
