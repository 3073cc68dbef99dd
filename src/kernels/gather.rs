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

/// A new `[picks.len(), k]` tensor whose row `i` is row `r` of `a` when
/// `picks[i] = (false, r)`, of `b` when `(true, r)` (a layer's kept
/// neurons and the ones read in for a new plan). Both must have `k` columns
/// and one dtype. On CPU a row-by-row memcpy; elsewhere a concatenation and
/// `index_select`.
pub fn merge_rows(a: &Tensor, b: &Tensor, picks: &[(bool, u32)]) -> Result<Tensor> {
    let ((na, k), (nb, kb)) = (a.dims2()?, b.dims2()?);
    if k != kb || a.dtype() != b.dtype() {
        candle_core::bail!(
            "merge_rows: [{na}, {k}] {:?} and [{nb}, {kb}] {:?} differ",
            a.dtype(),
            b.dtype()
        );
    }
    if let Some(&(from_b, r)) = picks
        .iter()
        .find(|&&(from_b, r)| r as usize >= if from_b { nb } else { na })
    {
        candle_core::bail!(
            "merge_rows: row {r} of {} is out of range",
            if from_b { "b" } else { "a" }
        );
    }
    let on_cpu = a.device().is_cpu() && a.is_contiguous() && b.is_contiguous();
    if !on_cpu {
        let all: Vec<u32> = picks
            .iter()
            .map(|&(from_b, r)| if from_b { na as u32 + r } else { r })
            .collect();
        return Tensor::cat(&[a, b], 0)?.index_select(&Tensor::new(all.as_slice(), a.device())?, 0);
    }
    fn merge<T: Copy>(a: &[T], b: &[T], k: usize, picks: &[(bool, u32)]) -> Vec<T> {
        let mut out: Vec<T> = Vec::with_capacity(picks.len() * k);
        crate::sys::hugepages::advise(
            out.as_ptr().cast(),
            picks.len() * k * std::mem::size_of::<T>(),
        );
        for &(from_b, r) in picks {
            let src = if from_b { b } else { a };
            out.extend_from_slice(&src[r as usize * k..(r as usize + 1) * k]);
        }
        out
    }
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (Some((a0, a1)), Some((b0, b1))) = (la.contiguous_offsets(), lb.contiguous_offsets())
    else {
        candle_core::bail!("merge_rows: a tensor is not contiguous");
    };
    let shape = (picks.len(), k);
    match (&*sa, &*sb) {
        (Storage::Cpu(CpuStorage::F32(x)), Storage::Cpu(CpuStorage::F32(y))) => {
            Tensor::from_vec(merge(&x[a0..a1], &y[b0..b1], k, picks), shape, a.device())
        }
        (Storage::Cpu(CpuStorage::F16(x)), Storage::Cpu(CpuStorage::F16(y))) => {
            Tensor::from_vec(merge(&x[a0..a1], &y[b0..b1], k, picks), shape, a.device())
        }
        (Storage::Cpu(CpuStorage::BF16(x)), Storage::Cpu(CpuStorage::BF16(y))) => {
            Tensor::from_vec(merge(&x[a0..a1], &y[b0..b1], k, picks), shape, a.device())
        }
        _ => candle_core::bail!("merge_rows: dtype {:?} is not supported", a.dtype()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn merged_rows_come_from_the_named_tensor() {
        let a = Tensor::arange(0f32, 12., &Device::Cpu)
            .unwrap()
            .reshape((4, 3))
            .unwrap();
        let b = Tensor::arange(100f32, 106., &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        for dtype in [candle_core::DType::F32, candle_core::DType::F16] {
            let (a, b) = (a.to_dtype(dtype).unwrap(), b.to_dtype(dtype).unwrap());
            let m = merge_rows(&a, &b, &[(true, 1), (false, 0), (false, 3)]).unwrap();
            let got = m
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            assert_eq!(
                got,
                vec![vec![103., 104., 105.], vec![0., 1., 2.], vec![9., 10., 11.]]
            );
        }
        assert!(merge_rows(&a, &b, &[(true, 2)]).is_err());
        assert!(merge_rows(&a, &a.t().unwrap(), &[(false, 0)]).is_err());
    }
}
