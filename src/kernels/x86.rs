//! The x86-64 back end: AVX2/FMA/F16C forms of the dot, row-axpy and
//! decode-attention kernels, used when [`available`] says the CPU has them.

use super::exp;
use half::f16;
use std::arch::x86_64::*;

pub(crate) use super::cpu_features::avx2 as available;

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

/// Asks for every cache line of `w` (a row about to be read alone).
#[inline]
pub(crate) fn prefetch_all<T>(w: &[T]) {
    let (p, bytes) = (w.as_ptr() as *const i8, std::mem::size_of_val(w));
    let mut o = 0;
    while o < bytes {
        // SAFETY: a prefetch is a hint; it never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o)) };
        o += 64;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_ahead::<PREFETCH_BYTES>(w, x)
}

/// [`dot_f32`] prefetching `AHEAD` bytes ahead (0: nothing past what it
/// reads — for rows read alone, whose next row may not be read at all).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32_ahead<const AHEAD: usize>(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        // 32 f32 are two cache lines.
        if AHEAD > 0 {
            prefetch(wp.add(i), AHEAD);
            prefetch(wp.add(i + 16), AHEAD);
        }
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
pub(crate) unsafe fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
    dot_f16_ahead::<PREFETCH_BYTES>(w, x)
}

/// [`dot_f16`] prefetching `AHEAD` bytes ahead (see [`dot_f32_ahead`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16_ahead<const AHEAD: usize>(w: &[f16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        if AHEAD > 0 {
            prefetch(wp.add(i), AHEAD);
        }
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
pub(crate) unsafe fn attend_head_f32(
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
pub(crate) fn exp8(x: &[f32]) -> [f32; 8] {
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
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp::LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp::LN2_LO), r);
    let mut y = _mm256_set1_ps(exp::POLY[0]);
    for c in &exp::POLY[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
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
    ($a:expr, $w:expr, $y:expr, $load:ident, $scalar:expr, $ahead:expr) => {{
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
                if $ahead > 0 {
                    prefetch(row.add(c), $ahead);
                    if two_lines {
                        prefetch(row.add(c + 16), $ahead);
                    }
                }
                for j in 0..4 {
                    let o = c + 8 * j;
                    let acc = _mm256_fmadd_ps(av, $load(row.add(o)), _mm256_loadu_ps(yp.add(o)));
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
pub(crate) unsafe fn axpy_rows_f32(a: &[f32], w: &[f32], y: &mut [f32]) {
    axpy_rows_body!(a, w, y, load_f32, |v: f32| v, PREFETCH_BYTES)
}

/// [`axpy_rows_f32`] prefetching nothing past what it reads.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy_rows_f32_alone(a: &[f32], w: &[f32], y: &mut [f32]) {
    axpy_rows_body!(a, w, y, load_f32, |v: f32| v, 0)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_f16(a: &[f32], w: &[f16], y: &mut [f32]) {
    axpy_rows_body!(a, w, y, load_f16, |v: f16| v.to_f32(), PREFETCH_BYTES)
}

/// [`axpy_rows_f16`] prefetching nothing past what it reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_f16_alone(a: &[f32], w: &[f16], y: &mut [f32]) {
    axpy_rows_body!(a, w, y, load_f16, |v: f16| v.to_f32(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_matches_expf() {
        if !available() {
            return;
        }
        let xs: Vec<f32> = (0..4000).map(|i| -90.0 + i as f32 * 0.0237).collect();
        for chunk in xs.chunks_exact(8) {
            let got = exp8(chunk);
            for (x, g) in chunk.iter().zip(got) {
                let want = x.exp();
                // Relative, but absolute where `expf` is subnormal (0 here).
                let tol = 2e-7 * want + 2e-38;
                assert!((g - want).abs() <= tol, "exp({x}) = {g}, want {want}");
            }
        }
    }
}
