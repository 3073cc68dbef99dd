//! Cephes' `expf`, the one polynomial `e^x` of the kernels: [`exp`], a
//! portable scalar form the compiler vectorises (the quantized MLP's
//! SiLU), and its constants, which the AVX2 softmax's eight-lane form
//! (`x86::exp_ps`, with fused multiply-adds) shares.

/// `ln 2` in two parts, `LN2_HI` exact in few bits, so that `x − n·ln 2`
/// keeps its precision.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial of `(e^r − 1 − r) / r²` on `|r| ≤ ln2/2`, highest degree
/// first (Horner).
pub(super) const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x`, portable, within 2 ulp for `x` in [−87, 88] (below, `e^−87`;
/// above, `e^88`, never infinite; NaN gives NaN), inlined: the libm call
/// per neuron cost the quantized MLP 10–15 % of its speed in L3
/// (docs/EXPERIMENTS.md, "Issue 22's bars on build 7cf6404"). `x = n·ln2 + r`, `|r| ≤ ln2/2`, `e^r` by the
/// polynomial, `2^n` by the exponent bits. Plain multiplies and adds,
/// never fused, so that the scalar and the vectorised forms give the same
/// bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // `1.5·2^23`: adding it rounds to an integer, left in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let nf = t - ROUND;
    let r = x - nf * LN2_HI - nf * LN2_LO;
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p * r + c;
    }
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite positive floats.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_over_its_range() {
        let mut worst = 0;
        // Every 1/4096 from -87 to 88, and the ends.
        for i in 0..=(175 * 4096) {
            let x = -87.0 + i as f32 / 4096.0;
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp(x), want));
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn exp_clamps_its_ends_and_keeps_nan() {
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite());
    }
}
