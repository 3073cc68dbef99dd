//! CPU kernels for the single-token (decode) path.
//!
//! Decode is memory-bound: every weight is read once per token. candle's
//! general matmul streams ~20 GB/s on our CPUs for a `[1, K] x [N, K]^T`
//! product, well below the ~30 GB/s the memory delivers (see
//! `../shared/notes/cpu-perf-facts.md`). These kernels are plain row-dot and
//! row-axpy loops, vectorised with AVX2/FMA/F16C when the CPU has them, split
//! over the threads of [`crate::spin_pool`] in contiguous row blocks so each
//! thread streams its own part of the matrix, in memory order. They work on
//! raw slices: the model's CPU decode step (`Model::decode_cpu`) runs a whole
//! token on plain buffers, reading weights through [`with_weight`], so no
//! candle op (allocation, dispatch) sits between two kernels while the other
//! threads wait. Other devices use candle's ops.

use crate::spin_pool::{DisjointSlice, SpinPool};
use candle_core::{CpuStorage, Layout, Result, Storage, Tensor};
use half::f16;

/// Smallest block of rows a thread takes at once: 64 rows are 72–230 KiB of
/// weights at our widths, so handing out blocks costs nothing next to
/// reading them (16 was ~10% slower in SmolLM2 f16 decode).
const MIN_ROWS_PER_BLOCK: usize = 64;

/// Element types our weight matrices may have on CPU.
pub trait WeightElem: Copy + Send + Sync + 'static {
    fn dot(w: &[Self], x: &[f32]) -> f32;
    /// `y += a[0]*w[0] + ... + a[r-1]*w[r-1]` over `r` rows of length `y.len()`.
    fn axpy_rows(a: &[f32], w: &[Self], y: &mut [f32]);
}

impl WeightElem for f32 {
    #[inline]
    fn dot(w: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { simd::dot_f32(w, x) };
        }
        portable::dot_f32(w, x)
    }
    #[inline]
    fn axpy_rows(a: &[f32], w: &[f32], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            // SAFETY: as above.
            return unsafe { simd::axpy_rows_f32(a, w, y) };
        }
        let k = y.len();
        for (r, &ar) in a.iter().enumerate() {
            for (yi, wi) in y.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                *yi += ar * wi;
            }
        }
    }
}

impl WeightElem for f16 {
    #[inline]
    fn dot(w: &[f16], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above).
            return unsafe { simd::dot_f16(w, x) };
        }
        portable::dot_f16(w, x)
    }
    #[inline]
    fn axpy_rows(a: &[f32], w: &[f16], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            // SAFETY: as above.
            return unsafe { simd::axpy_rows_f16(a, w, y) };
        }
        portable::axpy_rows_f16(a, w, y)
    }
}

/// `out[r] = w[r, :] · x` for a row-major `w` of `out.len()` rows.
pub fn matvec<T: WeightElem>(w: &[T], x: &[f32], out: &mut [f32]) {
    let k = x.len();
    debug_assert_eq!(w.len(), out.len() * k);
    let rows = out.len();
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(rows, MIN_ROWS_PER_BLOCK, |_, block| {
        let w = &w[block.start * k..block.end * k];
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block) };
        for (oi, row) in o.iter_mut().zip(w.chunks_exact(k)) {
            *oi = T::dot(row, x);
        }
    });
}

/// A CPU weight matrix's data, by dtype.
pub enum Weight<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl Weight<'_> {
    /// `out = self · x` ([`matvec`]).
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Weight::F32(w) => matvec(w, x, out),
            Weight::F16(w) => matvec(w, x, out),
        }
    }
}

/// Runs `f` on the data of a CPU tensor of f32 values, with its layout
/// (views such as a KV cache's filled part are strided).
pub fn with_f32_layout<R>(t: &Tensor, f: impl FnOnce(&[f32], &Layout) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(v, layout),
        _ => candle_core::bail!(
            "expected an f32 CPU tensor, found {:?} on {:?}",
            t.dtype(),
            t.device()
        ),
    }
}

/// Runs `f` on the data of a contiguous f32 CPU tensor.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    with_f32_layout(t, |v, l| match l.contiguous_offsets() {
        Some((a, b)) => f(&v[a..b]),
        None => candle_core::bail!("expected a contiguous tensor"),
    })
}

/// Runs `f` on the data of a contiguous f32 or f16 CPU tensor (a weight).
pub fn with_weight<R>(t: &Tensor, f: impl FnOnce(Weight<'_>) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Some((a, b)) = layout.contiguous_offsets() else {
        candle_core::bail!("weight must be contiguous");
    };
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Weight::F32(&v[a..b])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Weight::F16(&v[a..b])),
        _ => candle_core::bail!(
            "decode kernels take f32/f16 CPU weights, not {:?} on {:?}",
            t.dtype(),
            t.device()
        ),
    }
}

/// The whole SwiGLU MLP of one row in one parallel pass for `gate_up [2N, H]`
/// (gate rows, then up rows) and `down_t [N, H]` (neurons as rows) of the
/// same dtype: `y = down(silu(gate·x) * (up·x))`.
pub fn swiglu_mlp_weights(
    x: &[f32],
    gate_up: &Weight,
    down_t: &Weight,
    y: &mut [f32],
) -> Result<()> {
    fn checked<T: WeightElem>(x: &[f32], gate_up: &[T], down_t: &[T], y: &mut [f32]) -> Result<()> {
        let (h, n) = (x.len(), down_t.len());
        if y.len() != h || gate_up.len() != 2 * n || !n.is_multiple_of(h.max(1)) {
            candle_core::bail!(
                "swiglu-mlp: input of {h} for {} gate/up and {n} down weights",
                gate_up.len()
            );
        }
        swiglu_mlp(x, gate_up, down_t, y);
        Ok(())
    }
    match (gate_up, down_t) {
        (Weight::F32(g), Weight::F32(d)) => checked(x, g, d, y),
        (Weight::F16(g), Weight::F16(d)) => checked(x, g, d, y),
        _ => candle_core::bail!("swiglu-mlp: gate/up and down have different dtypes"),
    }
}

/// `y = down_t^T · (silu(gate · x) * (up · x))` with `gate_up = [gate; up]`.
/// Each thread takes blocks of neurons and, for each block, reads its gate,
/// up and down rows one after another: no barrier and no activation vector
/// between the projections, and the activation function runs in parallel.
pub fn swiglu_mlp<T: WeightElem>(x: &[f32], gate_up: &[T], down_t: &[T], y: &mut [f32]) {
    let h = x.len();
    let n = down_t.len() / h.max(1);
    debug_assert_eq!(gate_up.len(), 2 * n * h);
    let (gate, up) = gate_up.split_at(n * h);
    let pool = SpinPool::global();
    // One partial output per block, added up in block order: the same
    // result whichever thread ran which block.
    let blocks = pool.partition(n, MIN_ROWS_PER_BLOCK);
    let mut partials = vec![0f32; blocks.len() * h];
    let parts = DisjointSlice::new(&mut partials);
    pool.run_blocks(&blocks, |index, block| {
        let span = block.start * h..block.end * h;
        let mut act: Vec<f32> = gate[span.clone()]
            .chunks_exact(h)
            .map(|g| T::dot(g, x))
            .collect();
        for (a, u) in act.iter_mut().zip(up[span.clone()].chunks_exact(h)) {
            *a = *a / (1.0 + (-*a).exp()) * T::dot(u, x);
        }
        // SAFETY: one partial per block; the blocks of one call are distinct.
        let part = unsafe { parts.range(index * h..(index + 1) * h) };
        T::axpy_rows(&act, &down_t[span], part);
    });
    sum_rows(&partials, y);
}

/// `y = Σ` of the rows of `partials` (rows of `y.len()`).
fn sum_rows(partials: &[f32], y: &mut [f32]) {
    y.fill(0.0);
    for p in partials.chunks(y.len()) {
        for (yi, pi) in y.iter_mut().zip(p) {
            *yi += pi;
        }
    }
}

/// RMSNorm of a single row: `out = x / rms(x) * weight`.
pub fn rms_norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

/// Rotates, in place, the first `heads` heads of `x` (HF "rotate half"
/// layout) by one position's `cos`/`sin` rows (`head_dim / 2` each).
pub fn rope_row(x: &mut [f32], cos: &[f32], sin: &[f32], head_dim: usize, heads: usize) {
    let half = head_dim / 2;
    for head in x[..heads * head_dim].chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

/// Attention of one query token over the cached keys/values: `q` of
/// `heads × head_dim`; `k`, `v` the storage of `[1, kv_heads, T, head_dim]`
/// tensors laid out by `kl`, `vl` (any strides with a contiguous last dim).
/// Returns `heads × head_dim` values. Grouped-query: query head `h` uses kv
/// head `h / (heads / kv_heads)`. Heads are split over the decode threads.
pub fn decode_attention(
    q: &[f32],
    (k, kl): (&[f32], &Layout),
    (v, vl): (&[f32], &Layout),
    heads: usize,
) -> Result<Vec<f32>> {
    let (_, kv_heads, t, hd) = kl.shape().dims4()?;
    if vl.shape() != kl.shape()
        || q.len() != heads * hd
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
    {
        candle_core::bail!(
            "decode attention: inconsistent shapes q {} ({heads} heads) k {:?} v {:?}",
            q.len(),
            kl.shape(),
            vl.shape()
        );
    }
    if kl.stride()[3] != 1 || vl.stride()[3] != 1 {
        candle_core::bail!("decode attention: k/v rows must be contiguous");
    }
    // Every row the heads read must lie inside the storage.
    let last = |l: &Layout| {
        l.start_offset() + (kv_heads - 1) * l.stride()[1] + (t - 1) * l.stride()[2] + hd
    };
    if t == 0 || last(kl) > k.len() || last(vl) > v.len() {
        candle_core::bail!(
            "decode attention: no cached position, or k/v views outside their storage"
        );
    }
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; heads * hd];
    let heads_out = DisjointSlice::new(&mut out);
    SpinPool::global().for_each_block(heads, 1, |_, block| {
        let mut scores = vec![0f32; t];
        for h in block {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let kr = (k, kl.start_offset() + kvh * kl.stride()[1], kl.stride()[2]);
            let vr = (v, vl.start_offset() + kvh * vl.stride()[1], vl.stride()[2]);
            // SAFETY: each head is in exactly one block.
            let o = unsafe { heads_out.range(h * hd..(h + 1) * hd) };
            #[cfg(target_arch = "x86_64")]
            if simd::available() && hd.is_multiple_of(8) {
                // SAFETY: AVX2/FMA checked, `hd` a multiple of 8, rows
                // inside the storage (checked above).
                unsafe { simd::attend_head_f32(qh, kr, vr, scale, &mut scores, o) };
                continue;
            }
            attend_head(qh, kr, vr, scale, &mut scores, o);
        }
    });
    Ok(out)
}

/// Rows of a strided f32 matrix: the data, where row 0 starts, and the
/// distance between rows (a KV-cache view of one kv head).
type StridedRows<'a> = (&'a [f32], usize, usize);

/// Portable form of `simd::attend_head_f32`: one query head's attention.
fn attend_head(
    q: &[f32],
    k: StridedRows,
    v: StridedRows,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let ((k, kbase, kstride), (v, vbase, vstride)) = (k, v);
    let hd = q.len();
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        *s = portable::dot_f32(&k[kbase + j * kstride..][..hd], q) * scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    for (j, s) in scores.iter().enumerate() {
        let p = s / sum;
        let row = &v[vbase + j * vstride..][..hd];
        out.iter_mut().zip(row).for_each(|(o, v)| *o += p * v);
    }
}

/// The kernels' forms without `std::arch` (an ARM CPU such as a Jetson's,
/// or an x86 one without AVX2/FMA/F16C), written so that the compiler
/// vectorises them for any target: sums run in [`portable::LANES`]
/// independent lanes (a single running sum is a dependency chain the
/// compiler may not reorder), and f16 rows are widened a chunk at a time
/// with `half`'s slice conversion (NEON `fcvtl`, F16C) rather than one
/// element at a time.
pub mod portable {
    use half::{f16, slice::HalfFloatSliceExt};

    /// Independent partial sums of a dot product.
    pub const LANES: usize = 16;
    /// f16 values widened at once (on the stack).
    const CHUNK: usize = 256;

    pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (w, x) = (&w[..n], &x[..n]);
        let mut acc = [0f32; LANES];
        for (a, b) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
            for i in 0..LANES {
                acc[i] += a[i] * b[i];
            }
        }
        let tail = n - n % LANES;
        let rest: f32 = w[tail..].iter().zip(&x[tail..]).map(|(a, b)| a * b).sum();
        acc.iter().sum::<f32>() + rest
    }

    pub fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
        let mut wide = [0f32; CHUNK];
        w.chunks(CHUNK)
            .zip(x.chunks(CHUNK))
            .map(|(w, x)| {
                let wide = &mut wide[..w.len()];
                w.convert_to_f32_slice(wide);
                dot_f32(wide, x)
            })
            .sum()
    }

    /// `y += Σ_r a[r] · w[r, :]` over f16 rows of length `y.len()`.
    pub fn axpy_rows_f16(a: &[f32], w: &[f16], y: &mut [f32]) {
        let k = y.len();
        let mut wide = [0f32; CHUNK];
        for (r, &ar) in a.iter().enumerate() {
            let row = &w[r * k..(r + 1) * k];
            for (start, part) in (0..k).step_by(CHUNK).zip(row.chunks(CHUNK)) {
                let wide = &mut wide[..part.len()];
                part.convert_to_f32_slice(wide);
                y[start..start + part.len()]
                    .iter_mut()
                    .zip(wide.iter())
                    .for_each(|(yi, wi)| *yi += ar * wi);
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn data(n: usize, seed: f32) -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
        }

        #[test]
        fn dots_and_row_sums_match_plain_loops_for_odd_lengths() {
            for n in [0, 1, 15, 16, 17, 255, 256, 257, 576, 1000] {
                let (w, x) = (data(n, 0.3), data(n, 1.1));
                let plain: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!(
                    (dot_f32(&w, &x) as f64 - plain).abs() < 1e-4,
                    "f32 dot of {n}"
                );
                let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
                let plain: f64 = wh.iter().zip(&x).map(|(a, b)| a.to_f64() * *b as f64).sum();
                assert!(
                    (dot_f16(&wh, &x) as f64 - plain).abs() < 1e-4,
                    "f16 dot of {n}"
                );
            }
            for (rows, k) in [(1, 1), (3, 17), (5, 256), (2, 300)] {
                let a = data(rows, 0.7);
                let w: Vec<f16> = data(rows * k, 2.0)
                    .iter()
                    .map(|&v| f16::from_f32(v))
                    .collect();
                let mut y = data(k, 0.1);
                let mut want = y.clone();
                for r in 0..rows {
                    for i in 0..k {
                        want[i] += a[r] * w[r * k + i].to_f32();
                    }
                }
                axpy_rows_f16(&a, &w, &mut y);
                let diff = y
                    .iter()
                    .zip(&want)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0f32, f32::max);
                assert!(diff < 1e-5, "f16 axpy of {rows}x{k}: {diff}");
            }
        }
    }
}

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
        crate::hugepages::advise(out.as_ptr().cast(), len * std::mem::size_of::<T>());
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

#[cfg(target_arch = "x86_64")]
mod simd {
    use half::f16;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    pub fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// How far ahead of the loads the dot and axpy kernels ask for the
    /// weights. The hardware prefetcher alone kept two threads ~5% below
    /// this in `examples/kernel_speed.rs` (f16; best of interleaved rounds),
    /// as the f16 loop's extra conversions leave fewer lines in flight. On
    /// huge pages, 1–1.4 KiB ahead streamed best (0.5 KiB and 2 KiB 6–9%
    /// slower), and the axpy's prefetch gained 1–2.5% for f16 (f32 neutral;
    /// SmolLM2-shaped token, variants interleaved in one process).
    const PREFETCH_BYTES: usize = 1024;

    /// Asks for the cache line `ahead` bytes past `p` (a hint: never faults,
    /// also past the end of the weights).
    #[inline]
    #[target_feature(enable = "sse")]
    unsafe fn prefetch<T>(p: *const T, ahead: usize) {
        _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(ahead));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            // 32 f32 are two cache lines.
            prefetch(wp.add(i), PREFETCH_BYTES);
            prefetch(wp.add(i + 16), PREFETCH_BYTES);
            for (j, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * j;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(xp.add(o)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(wp.add(i)),
                _mm256_loadu_ps(xp.add(i)),
                acc[0],
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += w[i] * x[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            prefetch(wp.add(i), PREFETCH_BYTES);
            for (j, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * j;
                *a = _mm256_fmadd_ps(load_f16(wp.add(o)), _mm256_loadu_ps(xp.add(o)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(load_f16(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += w[i].to_f32() * x[i];
            i += 1;
        }
        s
    }

    /// One query head's attention over `scores.len()` cached positions in
    /// one vectorised loop: `scores[j] = (k_j · q) · scale`, softmax, then
    /// `out = Σ_j p_j v_j`. Row `j` of `k` starts at `kbase + j * kstride`
    /// (likewise `v`), `q.len()` values each.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `q.len()` is a multiple of 8 and equals
    /// `out.len()`; every row lies inside `k` / `v`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn attend_head_f32(
        q: &[f32],
        k: super::StridedRows,
        v: super::StridedRows,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let ((k, kbase, kstride), (v, vbase, vstride)) = (k, v);
        let hd = q.len();
        let (qp, kp, vp, op) = (q.as_ptr(), k.as_ptr(), v.as_ptr(), out.as_mut_ptr());
        let mut max = f32::NEG_INFINITY;
        for (j, s) in scores.iter_mut().enumerate() {
            let row = kp.add(kbase + j * kstride);
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut c = 0;
            while c + 16 <= hd {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(c)), _mm256_loadu_ps(qp.add(c)), a0);
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(row.add(c + 8)),
                    _mm256_loadu_ps(qp.add(c + 8)),
                    a1,
                );
                c += 16;
            }
            if c < hd {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(c)), _mm256_loadu_ps(qp.add(c)), a0);
            }
            *s = hsum(_mm256_add_ps(a0, a1)) * scale;
            max = max.max(*s);
        }
        // Softmax, eight scores at a time.
        let (n, maxv) = (scores.len(), _mm256_set1_ps(max));
        let sp = scores.as_mut_ptr();
        let mut sums = _mm256_setzero_ps();
        let mut j = 0;
        while j + 8 <= n {
            let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sp.add(j)), maxv));
            _mm256_storeu_ps(sp.add(j), e);
            sums = _mm256_add_ps(sums, e);
            j += 8;
        }
        let mut sum = hsum(sums);
        for s in &mut scores[j..] {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        // Weighted sum of the value rows, up to 64 columns at a time held in
        // registers across the positions.
        let mut c0 = 0;
        while c0 < hd {
            let cols = (hd - c0).min(64);
            let (vp, op) = (vp.add(c0), op.add(c0));
            match cols / 8 {
                1 => weighted_rows::<1>(scores, inv, (vp, vbase, vstride), op),
                2 => weighted_rows::<2>(scores, inv, (vp, vbase, vstride), op),
                3 => weighted_rows::<3>(scores, inv, (vp, vbase, vstride), op),
                4 => weighted_rows::<4>(scores, inv, (vp, vbase, vstride), op),
                5 => weighted_rows::<5>(scores, inv, (vp, vbase, vstride), op),
                6 => weighted_rows::<6>(scores, inv, (vp, vbase, vstride), op),
                7 => weighted_rows::<7>(scores, inv, (vp, vbase, vstride), op),
                _ => weighted_rows::<8>(scores, inv, (vp, vbase, vstride), op),
            }
            c0 += cols;
        }
    }

    /// `out[..8N] = Σ_j scores[j]·inv · v_j[..8N]`, the `N` vectors of the
    /// output held in registers over all positions `j` (row `j` of `v` at
    /// `vbase + j * vstride`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weighted_rows<const N: usize>(
        scores: &[f32],
        inv: f32,
        (vp, vbase, vstride): (*const f32, usize, usize),
        op: *mut f32,
    ) {
        let mut acc = [_mm256_setzero_ps(); N];
        for (j, s) in scores.iter().enumerate() {
            let p = _mm256_set1_ps(s * inv);
            let row = vp.add(vbase + j * vstride);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(p, _mm256_loadu_ps(row.add(8 * i)), *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(8 * i), *a);
        }
    }

    /// [`exp_ps`] of eight values (tests).
    #[cfg(test)]
    pub fn exp8(x: &[f32]) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: the tests call this only where `available()`; `x` has 8.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp_ps(_mm256_loadu_ps(x[..8].as_ptr()))) };
        out
    }

    /// `e^x` of eight lanes (Cephes' `expf`: range reduction by ln 2 and a
    /// degree-5 polynomial; relative error ≤ 2e-7). Below -87.3, where
    /// `expf` turns subnormal, it gives 0. For the softmax, whose inputs
    /// are ≤ 0.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_ps(x: __m256) -> __m256 {
        let normal = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-87.3));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.3));
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.3));
        // n = round(x / ln 2), r = x - n ln 2 (in two parts for precision).
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            5e-1,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            y,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        // Times 2^n, built in the exponent bits.
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_and_ps(_mm256_mul_ps(y, pow2n), normal)
    }

    /// Shared body of the axpy kernels: one row at a time, so the weights
    /// are read strictly in memory order. (Four rows per pass over `y` saves
    /// loads and stores of `y`, which sits in L1, but interleaves four
    /// streams within a few KiB; on our Zen 3 VMs that streamed 16–19 GB/s
    /// from memory with two threads instead of 25–27.)
    macro_rules! axpy_rows_body {
        ($a:expr, $w:expr, $y:expr, $load:ident, $scalar:expr) => {{
            let (a, w, y) = ($a, $w, $y);
            let k = y.len();
            let wp = w.as_ptr();
            let yp = y.as_mut_ptr();
            // 32 elements are one cache line of f16, two of f32.
            let two_lines = w.first().is_some_and(|v| std::mem::size_of_val(v) == 4);
            for (r, &ar) in a.iter().enumerate() {
                let av = _mm256_set1_ps(ar);
                let row = wp.add(r * k);
                let mut c = 0;
                while c + 32 <= k {
                    prefetch(row.add(c), PREFETCH_BYTES);
                    if two_lines {
                        prefetch(row.add(c + 16), PREFETCH_BYTES);
                    }
                    for j in 0..4 {
                        let o = c + 8 * j;
                        let acc =
                            _mm256_fmadd_ps(av, $load(row.add(o)), _mm256_loadu_ps(yp.add(o)));
                        _mm256_storeu_ps(yp.add(o), acc);
                    }
                    c += 32;
                }
                while c + 8 <= k {
                    let acc = _mm256_fmadd_ps(av, $load(row.add(c)), _mm256_loadu_ps(yp.add(c)));
                    _mm256_storeu_ps(yp.add(c), acc);
                    c += 8;
                }
                while c < k {
                    *yp.add(c) += ar * $scalar(w[r * k + c]);
                    c += 1;
                }
            }
        }};
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_rows_f32(a: &[f32], w: &[f32], y: &mut [f32]) {
        axpy_rows_body!(a, w, y, load_f32, |v: f32| v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_rows_f16(a: &[f32], w: &[f16], y: &mut [f32]) {
        axpy_rows_body!(a, w, y, load_f16, |v: f16| v.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks(x.len())
            .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn matvec_matches_reference_for_odd_shapes() {
        for &(n, k) in &[(1, 1), (7, 13), (130, 67), (300, 576)] {
            let (w, x) = (data(n * k, 1), data(k, 2));
            let mut out = vec![0.0; n];
            matvec(&w, &x, &mut out);
            let want = reference_matvec(&w, &x);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-3, "{n}x{k}: {a} vs {b}");
            }
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            matvec(&wh, &x, &mut out);
            let wr: Vec<f32> = wh.iter().map(|v| v.to_f32()).collect();
            for (a, b) in out.iter().zip(reference_matvec(&wr, &x)) {
                assert!((a - b).abs() < 1e-3, "f16 {n}x{k}: {a} vs {b}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_matches_expf() {
        if !simd::available() {
            return;
        }
        let xs: Vec<f32> = (0..4000).map(|i| -90.0 + i as f32 * 0.0237).collect();
        for chunk in xs.chunks_exact(8) {
            let got = simd::exp8(chunk);
            for (x, g) in chunk.iter().zip(got) {
                let want = x.exp();
                // Relative, but absolute where `expf` is subnormal (0 here).
                let tol = 2e-7 * want + 2e-38;
                assert!((g - want).abs() <= tol, "exp({x}) = {g}, want {want}");
            }
        }
    }

    #[test]
    fn decode_attention_matches_reference_on_a_strided_cache() {
        // A cache of capacity 24 holding 19 positions (two vectors of
        // scores and a tail), as the KV cache's views are; head_dim 16 and
        // 80 (64 + 16 columns in registers) take the vectorised path, 12
        // the portable one.
        for hd in [16, 80, 12] {
            let (heads, kv_heads, cap, t) = (6, 2, 24, 19);
            let layout = Layout::contiguous((1, kv_heads, cap, hd))
                .narrow(2, 0, t)
                .unwrap();
            let (k, v, q) = (
                data(kv_heads * cap * hd, 7),
                data(kv_heads * cap * hd, 8),
                data(heads * hd, 9),
            );
            let out = decode_attention(&q, (&k, &layout), (&v, &layout), heads).unwrap();
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let row = |m: &[f32], j: usize| m[(kvh * cap + j) * hd..][..hd].to_vec();
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f32> = (0..t)
                    .map(|j| {
                        row(&k, j).iter().zip(qh).map(|(a, b)| a * b).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                for c in 0..hd {
                    let want: f32 = (0..t).map(|j| e[j] / sum * row(&v, j)[c]).sum();
                    let got = out[h * hd + c];
                    assert!(
                        (got - want).abs() < 1e-5,
                        "hd {hd} head {h} col {c}: {got} vs {want}"
                    );
                }
            }
            // A view reaching outside the storage is refused, not read.
            let short = &k[..k.len() - 1];
            let wide = Layout::contiguous((1, kv_heads, cap, hd));
            assert!(decode_attention(&q, (short, &wide), (&v, &wide), heads).is_err());
        }
    }

    #[test]
    fn swiglu_mlp_matches_reference_for_odd_shapes() {
        let silu = |v: f32| v / (1.0 + (-v).exp());
        for &(n, h) in &[(1, 1), (5, 9), (131, 67), (1000, 576)] {
            let (gu, d, x) = (data(2 * n * h, 3), data(n * h, 4), data(h, 5));
            let mut y = vec![0.0; h];
            swiglu_mlp(&x, &gu, &d, &mut y);
            let g = reference_matvec(&gu[..n * h], &x);
            let u = reference_matvec(&gu[n * h..], &x);
            let act: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            for c in 0..h {
                let want: f32 = (0..n).map(|i| act[i] * d[i * h + c]).sum();
                assert!(
                    (y[c] - want).abs() < 1e-2 * (1.0 + want.abs()),
                    "{n}x{h} col {c}: {} vs {want}",
                    y[c]
                );
            }
        }
    }
}
