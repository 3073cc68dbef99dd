//! A screened output layer: a 4-bit copy of the lm_head (ggml's `Q4_0`,
//! 0.56 bytes a weight) scores every output row, and only the `k` rows it
//! ranks highest are computed exactly from the lm_head's own weights; the
//! other rows keep the screen's logits. The lm_head's rows are output
//! neurons, and the screen is their predictor (as a low-bit predictor picks
//! FFN neurons): decode reads the screen and `k` rows instead of the whole
//! head (Qwen2.5-0.5B in f16: 77 MB + 0.1 MB for 272 MB). The greedy token
//! is the exact head's whenever it is among the `k` (on Qwen2.5-0.5B's dev
//! prompts `k` 3 kept it at 767 of 768 positions, docs/RESULTS.md);
//! sampled tail tokens take the screen's logits.

use super::linear::{Linear, QMatrix, Weights};
use super::vocab::OutputVocab;
use crate::kernels::quant::{Q8Act, QFormat};
use anyhow::{bail, Context, Result};
use candle_core::{quantized::QTensor, Device, Tensor};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Rows quantized at a time while the screen is built (~8 MiB of f32).
const BUILD_ROWS: usize = 2048;

#[derive(Debug, Clone)]
pub struct HeadScreen {
    /// Rows computed exactly per step.
    k: usize,
    /// The lm_head's rows in `Q4_0`.
    rows: QMatrix,
}

/// An f32 that orders totally (for the heap of the best rows).
struct Score(f32, u32);
impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

impl HeadScreen {
    /// The screen of `head` (`[vocab, hidden]`, any dtype on the CPU),
    /// computing `k` rows exactly per step (1 ≤ k ≤ vocab).
    pub fn build(head: &Linear, k: usize) -> Result<Self> {
        let (n, cols) = head.dims()?;
        check_k(k, n)?;
        if !cols.is_multiple_of(crate::kernels::quant::QK) {
            bail!("head_screen: rows of {cols} are not whole 32-weight blocks");
        }
        let mut data = Vec::with_capacity(QFormat::Q4_0.row_bytes(cols) * n);
        let mut buf = vec![0f32; BUILD_ROWS.min(n) * cols];
        for r0 in (0..n).step_by(BUILD_ROWS) {
            let r1 = (r0 + BUILD_ROWS).min(n);
            let f = &mut buf[..(r1 - r0) * cols];
            match head.weights() {
                Weights::Quant(q) => q.dequantize_rows(r0..r1, f),
                Weights::Dense(t) => {
                    let rows = t
                        .narrow(0, r0, r1 - r0)?
                        .to_dtype(candle_core::DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()
                        .context("head_screen: reading the lm_head's rows (CPU only)")?;
                    f.copy_from_slice(&rows);
                }
            }
            let t = Tensor::from_slice(f, (r1 - r0, cols), &Device::Cpu)?;
            data.extend_from_slice(&QTensor::quantize(&t, QFormat::Q4_0.ggml())?.data()?);
        }
        Ok(Self {
            k,
            rows: QMatrix::new(cols, vec![(QFormat::Q4_0, n)], data)?,
        })
    }

    /// The same screen computing `k` rows exactly (of `n`, the head's rows).
    pub fn with_k(self, k: usize, n: usize) -> Result<Self> {
        check_k(k, n)?;
        Ok(Self { k, ..self })
    }

    /// Refuses a head this screen was not built for (by shape).
    pub fn check_head(&self, head: &Linear) -> Result<()> {
        let (n, cols) = head.dims()?;
        if (self.rows.rows(), self.rows.cols()) != (n, cols) {
            bail!(
                "head_screen of [{}, {}] given an lm_head [{n}, {cols}]",
                self.rows.rows(),
                self.rows.cols()
            );
        }
        Ok(())
    }

    /// Rows computed exactly per step.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of the screen's rows (held beside the lm_head's).
    pub fn bytes(&self) -> usize {
        self.rows.bytes()
    }

    /// Bytes one step reads: the screen's rows of `vocab` (all without
    /// one) and `k` of `head`'s rows.
    pub fn step_bytes(&self, head: &Linear, vocab: Option<&OutputVocab>) -> usize {
        let rows = vocab.map_or(self.rows.rows(), OutputVocab::rows);
        self.rows.bytes() * rows / self.rows.rows().max(1) + head.rows_bytes(self.k)
    }

    /// The logits of one normed row `x`: the screen's over the rows of
    /// `vocab` (every row without one; the others −∞), the `k` best of
    /// them replaced by `head`'s exact logits (bias added).
    pub fn logits(
        &self,
        head: &Linear,
        x: &[f32],
        vocab: Option<&OutputVocab>,
    ) -> Result<Vec<f32>> {
        let (n, cols) = head.dims()?;
        if x.len() != cols || self.rows.rows() != n {
            bail!(
                "head_screen of {} rows over an lm_head [{n}, {cols}] given a row of {}",
                self.rows.rows(),
                x.len()
            );
        }
        let xq = Q8Act::quantize(x);
        let mut y = vec![f32::NEG_INFINITY; n];
        match vocab {
            Some(v) => {
                let mut ey = vec![0f32; v.extra().len()];
                self.rows
                    .matvec_subset(&xq, &mut y[..v.prefix()], v.extra(), &mut ey);
                for (&e, v) in v.extra().iter().zip(ey) {
                    y[e as usize] = v;
                }
            }
            None => self.rows.matvec(&xq, &mut y),
        }
        head.add_bias_to(&mut y)?;
        let ids = top_k(&y, self.k);
        for (&id, exact) in ids.iter().zip(head.forward_row_ids(x, &ids)?) {
            y[id as usize] = exact;
        }
        Ok(y)
    }
}

/// Bytes a screen of an lm_head `[rows, cols]` holds, plus the f32 rows
/// its build converts at a time (a memory plan counts both).
pub fn memory_bytes(rows: usize, cols: usize) -> u64 {
    (QFormat::Q4_0.row_bytes(cols) * rows + 2 * 4 * BUILD_ROWS.min(rows) * cols) as u64
}

/// `k` exact rows of an output layer of `n`: 1 ≤ k ≤ n.
fn check_k(k: usize, n: usize) -> Result<()> {
    if k == 0 || k > n {
        bail!("head_screen: {k} exact rows asked of an output layer of {n} rows (1..={n})");
    }
    Ok(())
}

/// The ids of the `k` largest finite values of `y`, ascending.
fn top_k(y: &[f32], k: usize) -> Vec<u32> {
    let mut heap: BinaryHeap<Reverse<Score>> = BinaryHeap::with_capacity(k + 1);
    for (i, &v) in y.iter().enumerate() {
        if v == f32::NEG_INFINITY || v.is_nan() {
            continue;
        }
        if heap.len() < k {
            heap.push(Reverse(Score(v, i as u32)));
        } else if heap.peek().is_some_and(|Reverse(s)| v > s.0) {
            heap.pop();
            heap.push(Reverse(Score(v, i as u32)));
        }
    }
    let mut ids: Vec<u32> = heap.into_iter().map(|Reverse(s)| s.1).collect();
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;

    fn head(rows: usize, cols: usize) -> Linear {
        let w = Tensor::from_vec(data(rows * cols, 3), (rows, cols), &Device::Cpu).unwrap();
        Linear::new(w, None).unwrap()
    }

    #[test]
    fn top_k_takes_the_largest_finite_values() {
        let y = [0.5, f32::NEG_INFINITY, 3.0, -1.0, 2.0, f32::NAN, 2.5];
        assert_eq!(top_k(&y, 3), vec![2, 4, 6]);
        assert_eq!(top_k(&y, 10), vec![0, 2, 3, 4, 6]);
    }

    #[test]
    fn every_row_exact_is_the_head_and_fewer_keep_the_best_exact() {
        let (n, cols) = (300, 64);
        let head = head(n, cols);
        let x = data(cols, 7);
        let exact = head.forward_row(&x).unwrap();
        let all = HeadScreen::build(&head, n).unwrap();
        assert_eq!(all.logits(&head, &x, None).unwrap(), exact);
        let screen = HeadScreen::build(&head, 8).unwrap();
        let got = screen.logits(&head, &x, None).unwrap();
        let same = got.iter().zip(&exact).filter(|(a, b)| a == b).count();
        assert!(same >= 8, "{same} rows exact");
        let best = |v: &[f32]| (0..n).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        assert_eq!(best(&got), best(&exact));
        // The screen's logits are the head's within the rounding of its
        // 4-bit weights (at most |w|max/16 each) and the 8-bit activations
        // (|x|max/254 each).
        let w = data(n * cols, 3);
        let xmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let xsum: f32 = x.iter().map(|v| v.abs()).sum();
        for ((g, e), row) in got.iter().zip(&exact).zip(w.chunks_exact(cols)) {
            let wmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let wsum: f32 = row.iter().map(|v| v.abs()).sum();
            let bound = xsum * wmax / 16.0 + wsum * xmax / 254.0 + 1e-4;
            assert!((g - e).abs() <= bound, "{g} vs {e} (bound {bound})");
        }
        // Restricted to a vocabulary: the rows outside are −∞.
        let v = OutputVocab::new(n, 100, vec![250]).unwrap();
        let got = screen.logits(&head, &x, Some(&v)).unwrap();
        assert!(got[100..250].iter().all(|&g| g == f32::NEG_INFINITY));
        assert!(got[..100]
            .iter()
            .chain(&got[250..251])
            .all(|g| g.is_finite()));
    }

    #[test]
    fn a_screen_of_no_rows_or_more_rows_than_the_head_is_refused() {
        let head = head(40, 32);
        for k in [0, 41] {
            let e = HeadScreen::build(&head, k).unwrap_err().to_string();
            assert!(e.contains("head_screen") && e.contains("40"), "{e}");
        }
    }
}
