//! Gathering rows of a weight matrix into a new buffer, or permuting them
//! in place (the per-prompt arrangement of the chosen neurons); gathering
//! a row's values in an order by the runs it keeps ([`Runs`]).

use candle_core::{CpuStorage, InplaceOp1, Layout, Result, Storage, Tensor};

/// Rows `rows` of a 2-D tensor as a new contiguous tensor. On CPU this is a
/// plain row-by-row memcpy (candle's `index_select` goes element by element
/// and is ~10x slower); elsewhere it is `index_select`.
pub(crate) fn gather_rows(t: &Tensor, rows: &[u32]) -> Result<Tensor> {
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
pub(crate) fn merge_rows(a: &Tensor, b: &Tensor, picks: &[(bool, u32)]) -> Result<Tensor> {
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

/// Stores record `src[i]` of `buf` (records of `bb` bytes; `src` a
/// permutation of them) at `i`, in place: each cycle of the permutation
/// followed once, one record of scratch.
pub(crate) fn permute_in_place(buf: &mut [u8], src: &[usize], bb: usize) {
    let n = src.len();
    let mut done = vec![false; n];
    let mut scratch = vec![0u8; bb];
    for start in 0..n {
        if done[start] || src[start] == start {
            continue;
        }
        // Bundle `start` is parked in `scratch`; each slot takes its
        // source until the cycle comes back to `start`.
        scratch.copy_from_slice(&buf[start * bb..(start + 1) * bb]);
        let mut dst = start;
        loop {
            done[dst] = true;
            let from = src[dst];
            if from == start {
                buf[dst * bb..(dst + 1) * bb].copy_from_slice(&scratch);
                break;
            }
            buf.copy_within(from * bb..(from + 1) * bb, dst * bb);
            dst = from;
        }
    }
}

/// Whether `src` names each of `0..n` once.
pub(crate) fn is_permutation(src: impl ExactSizeIterator<Item = usize>, n: usize) -> bool {
    let mut seen = vec![false; n];
    src.len() == n
        && src
            .into_iter()
            .all(|s| s < n && !std::mem::replace(&mut seen[s], true))
}

/// Whether [`permute_rows_in_place`] moves `t`'s rows in its own storage:
/// a contiguous CPU tensor of f32, f16 or bf16.
pub(crate) fn permutes_in_place(t: &Tensor) -> bool {
    use candle_core::DType;
    t.device().is_cpu()
        && t.is_contiguous()
        && matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// Stores row `src[i]` of the 2-D tensor `t` at row `i`, in `t`'s own
/// storage (clones and views of `t` see the move): no copy of the matrix,
/// one row of scratch. Returns `false`, with nothing done, unless
/// [`permutes_in_place`] (the caller gathers a copy instead); refuses `src`
/// unless it is a permutation of `t`'s rows.
pub(crate) fn permute_rows_in_place(t: &Tensor, src: &[u32]) -> Result<bool> {
    let (n, k) = t.dims2()?;
    if !is_permutation(src.iter().map(|&r| r as usize), n) {
        candle_core::bail!(
            "permute_rows: {} indices are not a permutation of {n} rows",
            src.len()
        );
    }
    if !permutes_in_place(t) {
        return Ok(false);
    }
    struct Permute(Vec<usize>, usize);
    impl InplaceOp1 for Permute {
        fn name(&self) -> &'static str {
            "permute-rows"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
            let Some((start, end)) = layout.contiguous_offsets() else {
                candle_core::bail!("permute_rows: tensor is not contiguous");
            };
            /// The elements as bytes (plain numbers: any bytes are valid).
            fn bytes<T: Copy>(v: &mut [T]) -> &mut [u8] {
                // SAFETY: `v`'s memory, viewed as bytes, for the borrow's life.
                unsafe {
                    std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v))
                }
            }
            let (buf, size) = match storage {
                CpuStorage::F32(v) => (bytes(&mut v[start..end]), 4),
                CpuStorage::F16(v) => (bytes(&mut v[start..end]), 2),
                CpuStorage::BF16(v) => (bytes(&mut v[start..end]), 2),
                _ => candle_core::bail!("permute_rows: rows of f32, f16 or bf16 only"),
            };
            permute_in_place(buf, &self.0, self.1 * size);
            Ok(())
        }
    }
    t.inplace_op1(&Permute(src.iter().map(|&r| r as usize).collect(), k))?;
    Ok(true)
}

/// Positions `0..n` of a row read in an order (`order[p]`: the column of
/// position `p`), cut in chunks of `width`: per chunk the runs of
/// positions whose columns follow one another, `(first position in the
/// chunk, first column, length)`. An arrangement of chosen neurons keeps
/// most neighbours together, so a chunk is a few copies, not `width`
/// single reads; worked out once per order, used for every row.
pub(crate) struct Runs {
    /// Each chunk's runs: `runs[starts[c]..starts[c + 1]]`.
    starts: Vec<usize>,
    runs: Vec<(u32, u32, u32)>,
}

impl Runs {
    pub(crate) fn new(order: &[u32], n: usize, width: usize) -> Self {
        assert!(width > 0 && order.len() >= n);
        let (mut starts, mut runs) = (vec![0], Vec::new());
        for at in (0..n).step_by(width) {
            let end = (at + width).min(n);
            let mut p = at;
            while p < end {
                let first = order[p];
                let mut len = 1;
                while p + len < end && order[p + len] == first + len as u32 {
                    len += 1;
                }
                runs.push(((p - at) as u32, first, len as u32));
                p += len;
            }
            starts.push(runs.len());
        }
        Self { starts, runs }
    }

    /// Where chunk `c` starts in the row when it is one run (its values
    /// side by side there), `None` when it is not.
    #[inline]
    pub(crate) fn one_run(&self, c: usize) -> Option<usize> {
        match &self.runs[self.starts[c]..self.starts[c + 1]] {
            [(0, first, _)] => Some(*first as usize),
            _ => None,
        }
    }

    /// Chunk `c`'s values of `row` into `out` (as long as the chunk), or
    /// the slice of `row` itself when the chunk is one run.
    #[inline]
    pub(crate) fn chunk<'a>(&self, row: &'a [f32], c: usize, out: &'a mut [f32]) -> &'a [f32] {
        let runs = &self.runs[self.starts[c]..self.starts[c + 1]];
        if let [(0, first, len)] = runs {
            let first = *first as usize;
            return &row[first..first + *len as usize];
        }
        for &(dst, src, len) in runs {
            let (dst, src, len) = (dst as usize, src as usize, len as usize);
            out[dst..dst + len].copy_from_slice(&row[src..src + len]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn runs_read_each_chunk_as_the_order_names_it() {
        let n = 75;
        let row: Vec<f32> = (0..n).map(|i| i as f32 * 1.5 - 7.0).collect();
        // Reversed (no run), an arrangement (chosen first: long runs), and
        // in order (one run a chunk: the row's own slice).
        let chosen = |c: usize| c % 9 != 4;
        let front = (0..n).filter(|&c| chosen(c)).count() as u32;
        let (mut f, mut r) = (0u32, front);
        let arranged: Vec<u32> = (0..n)
            .map(|c| {
                let at = if chosen(c) { &mut f } else { &mut r };
                *at += 1;
                *at - 1
            })
            .collect();
        let reversed: Vec<u32> = (0..n as u32).rev().collect();
        let straight: Vec<u32> = (0..n as u32).collect();
        for order in [&reversed, &arranged, &straight] {
            for width in [1, 16, 32] {
                let runs = Runs::new(order, n, width);
                for (c, at) in (0..n).step_by(width).enumerate() {
                    let len = width.min(n - at);
                    let mut out = vec![f32::NAN; len];
                    let got = runs.chunk(&row, c, &mut out).to_vec();
                    let want: Vec<f32> = order[at..at + len]
                        .iter()
                        .map(|&i| row[i as usize])
                        .collect();
                    assert_eq!(got, want, "chunk {c} of width {width}");
                }
            }
        }
    }

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

    #[test]
    fn rows_permuted_in_place_equal_the_gathered_rows_and_bad_input_is_refused() {
        let src = [3u32, 0, 4, 1, 2];
        for dtype in [candle_core::DType::F32, candle_core::DType::F16] {
            let t = Tensor::arange(0f32, 15., &Device::Cpu)
                .unwrap()
                .reshape((5, 3))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let values = |t: &Tensor| -> Vec<f32> {
                let t = t.to_dtype(candle_core::DType::F32).unwrap();
                t.flatten_all().unwrap().to_vec1().unwrap()
            };
            let want = values(&gather_rows(&t, &src).unwrap());
            let view = t.clone();
            assert!(permute_rows_in_place(&t, &src).unwrap());
            assert_eq!(values(&view), want, "{dtype:?}: in the shared storage");
        }
        let t = Tensor::zeros((3, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
        for bad in [&[0u32, 0, 1][..], &[0, 1], &[0, 1, 3]] {
            let err = permute_rows_in_place(&t, bad).unwrap_err().to_string();
            assert!(err.contains("not a permutation of 3 rows"), "{err}");
        }
        // A transposed view is not contiguous: left to the caller.
        let t = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        assert!(!permute_rows_in_place(&t, &[2, 1, 0]).unwrap());
    }
}
