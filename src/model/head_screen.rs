//! A screened output layer: a low-bit copy of the lm_head scores every
//! output row, and only the `k` rows it ranks highest are computed exactly
//! from the lm_head's own weights; the other rows keep the screen's
//! logits. The lm_head's rows are output neurons, and the screen is their
//! predictor (as a low-bit predictor picks FFN neurons): decode reads the
//! screen and `k` rows instead of the whole head. The greedy token is the
//! exact head's whenever it is among the `k`; sampled tail tokens take the
//! screen's logits.
//!
//! Two copies ([`ScreenBits`]): ggml's `Q4_0` (4.5 bits a weight; on
//! Qwen2.5-0.5B's dev prompts `k` 3 kept dense's greedy token at 767 of
//! 768 positions, on SmolLM2 `k` 16 at all), and [`q2`] rows (2 bits a
//! weight and one scale a row: half the bytes again; enough on Qwen2.5's
//! 896-wide rows with `k` in the hundreds, far from it on SmolLM2's;
//! docs/RESULTS.md).
//!
//! Built under an output vocabulary ([`OutputVocab`]), the copy holds
//! that vocabulary's rows only (Qwen2.5's Latin rows: 104,148 of 151,936,
//! 18 MB less in 2 bits); a step over every row (a prompt outside the
//! vocabulary) then computes the rows outside it exactly.
use super::linear::QMatrix;
use super::lm_head::LmHead;
use super::vocab::OutputVocab;
use crate::kernels::q2;
use crate::kernels::quant::{Q8Act, QFormat};
use anyhow::{bail, Context, Result};
use candle_core::{quantized::QTensor, Device, Tensor};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// Rows quantized at a time while the screen is built (~8 MiB of f32).
const BUILD_ROWS: usize = 2048;

/// The bits a weight of the screen's copy takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ScreenBits {
    /// ggml's `Q4_0` (4.5 bits a weight, scales included).
    #[default]
    #[serde(rename = "4")]
    Four,
    /// [`q2`] rows (2 bits a weight and one f32 a row).
    #[serde(rename = "2")]
    Two,
}

crate::sys::named::impl_named!(ScreenBits, "head_screen_bits", { Four => "4", Two => "2" });

impl ScreenBits {
    /// `4` or `2`; anything else is refused, naming `head_screen_bits`.
    pub(crate) fn from_bits(bits: i64) -> Result<Self> {
        bits.to_string().parse()
    }

    pub(crate) fn bits(self) -> u32 {
        match self {
            Self::Four => 4,
            Self::Two => 2,
        }
    }

    /// Bytes of one copied row of `cols` weights, its scales included.
    pub(crate) fn row_bytes(self, cols: usize) -> usize {
        match self {
            Self::Four => self.code_bytes(cols),
            Self::Two => self.code_bytes(cols) + 4,
        }
    }

    /// Bytes of one copied row's blocks (`Q4_0`) or codes (2-bit; its
    /// scale is held apart).
    fn code_bytes(self, cols: usize) -> usize {
        match self {
            Self::Four => QFormat::Q4_0.row_bytes(cols),
            Self::Two => q2::row_bytes(cols),
        }
    }
}

#[derive(Debug, Clone)]
pub struct HeadScreen {
    /// Rows computed exactly per step.
    k: usize,
    /// The lm_head's rows, copied (shared by clones: the engine keeps the
    /// screen it puts in force per request): every row, or `covered`'s
    /// (its prefix, then its extra rows).
    copy: Arc<RowCopy>,
    /// The vocabulary whose rows the copy holds; `None`: every row.
    covered: Option<Arc<Covered>>,
}

/// A vocabulary a screen's copy holds the rows of, and the row lists a
/// step needs, made once at build.
#[derive(Debug)]
struct Covered {
    vocab: OutputVocab,
    /// The vocabulary's extra rows as rows of the copy (after its prefix).
    extra_in_copy: Vec<u32>,
    /// The head's rows outside the vocabulary (computed exactly by a step
    /// over every row).
    outside: Vec<u32>,
}

impl Covered {
    fn new(vocab: &OutputVocab) -> Self {
        let n = vocab.vocab_size() as u32;
        Self {
            extra_in_copy: (vocab.prefix()..vocab.rows()).map(|r| r as u32).collect(),
            outside: (0..n).filter(|&t| !vocab.contains(t)).collect(),
            vocab: vocab.clone(),
        }
    }
}

/// The screen's copy of the lm_head's rows.
#[derive(Debug, Clone)]
enum RowCopy {
    Four(QMatrix),
    Two {
        /// Each row's codes, [`q2::row_bytes`] apart.
        codes: Vec<u8>,
        /// Each row's scale.
        d: Vec<f32>,
        cols: usize,
    },
}

impl RowCopy {
    fn rows(&self) -> usize {
        match self {
            Self::Four(m) => m.rows(),
            Self::Two { d, .. } => d.len(),
        }
    }

    fn cols(&self) -> usize {
        match self {
            Self::Four(m) => m.cols(),
            Self::Two { cols, .. } => *cols,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::Four(m) => m.bytes(),
            Self::Two { codes, d, .. } => codes.len() + 4 * d.len(),
        }
    }

    /// `y[r]` = the copy's row `r` · `x` for the rows `0..y.len()`, then
    /// `ey[j]` for the rows `extra[j]` (ascending).
    fn scores(&self, x: &[f32], y: &mut [f32], extra: &[u32], ey: &mut [f32]) {
        match self {
            Self::Four(m) => m.matvec_subset(&Q8Act::quantize(x), y, extra, ey),
            Self::Two { codes, d, .. } => {
                let xq = q2::Q8Row::quantize(x);
                q2::matvec(codes, d, &xq, y);
                q2::matvec_ids(codes, d, extra, &xq, ey);
            }
        }
    }
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
    /// The screen of `head` (`[vocab, hidden]`, any dtype on the CPU), its
    /// copy in `bits` of `covered`'s rows (every row without one),
    /// computing `k` rows exactly per step (1 ≤ k ≤ vocab).
    pub fn build(
        head: &LmHead,
        k: usize,
        bits: ScreenBits,
        covered: Option<&OutputVocab>,
    ) -> Result<Self> {
        let (n, cols) = head.dims()?;
        check_k(k, n)?;
        if bits == ScreenBits::Four && !cols.is_multiple_of(crate::kernels::quant::QK) {
            bail!("head_screen: rows of {cols} are not whole 32-weight blocks");
        }
        if let Some(v) = covered {
            v.check_size(n)?;
        }
        // The head's rows the copy holds, as runs: the prefix, then runs
        // of consecutive extra rows.
        let runs = match covered {
            None => std::iter::once(0..n).collect(),
            Some(v) => row_runs(v),
        };
        let rows: usize = runs.iter().map(|r| r.len()).sum();
        let rb = bits.code_bytes(cols);
        let mut data = vec![0u8; rb * rows];
        let mut scales = Vec::with_capacity(if bits == ScreenBits::Two { rows } else { 0 });
        let mut buf = vec![0f32; BUILD_ROWS.min(rows) * cols];
        let mut at = 0;
        let pieces = runs.iter().flat_map(|run| {
            (run.start..run.end)
                .step_by(BUILD_ROWS)
                .map(move |r0| r0..(r0 + BUILD_ROWS).min(run.end))
        });
        for piece in pieces {
            let f = &mut buf[..piece.len() * cols];
            head.dequantize_rows(piece.clone(), f).with_context(|| {
                format!(
                    "head_screen: reading rows {}..{} of the lm_head",
                    piece.start, piece.end
                )
            })?;
            let out = &mut data[at * rb..(at + piece.len()) * rb];
            at += piece.len();
            match bits {
                ScreenBits::Four => {
                    let t = Tensor::from_slice(f, (piece.len(), cols), &Device::Cpu)?;
                    out.copy_from_slice(
                        &QTensor::quantize(&t, QFormat::Q4_0.ggml().context("q4_0 is ggml's")?)?
                            .data()?,
                    );
                }
                ScreenBits::Two => {
                    use rayon::prelude::*;
                    let d: Vec<f32> = f
                        .par_chunks_exact(cols)
                        .zip(out.par_chunks_exact_mut(rb))
                        .map(|(w, c)| q2::quantize_row(w, c))
                        .collect();
                    scales.extend(d);
                }
            }
        }
        let copy = match bits {
            ScreenBits::Four => {
                RowCopy::Four(QMatrix::new(cols, vec![(QFormat::Q4_0, rows)], data)?)
            }
            ScreenBits::Two => RowCopy::Two {
                codes: data,
                d: scales,
                cols,
            },
        };
        Ok(Self {
            k,
            copy: Arc::new(copy),
            covered: covered.map(|v| Arc::new(Covered::new(v))),
        })
    }

    /// Whether the copy holds the rows of `vocab` (every row: `None`) and
    /// no others.
    pub(crate) fn covers(&self, vocab: Option<&OutputVocab>) -> bool {
        self.covered.as_ref().map(|c| &c.vocab) == vocab
    }

    /// Rows the copy holds.
    pub(crate) fn rows(&self) -> usize {
        self.copy.rows()
    }

    /// The same screen computing `k` rows exactly (of `n`, the head's rows).
    pub(crate) fn with_k(self, k: usize, n: usize) -> Result<Self> {
        check_k(k, n)?;
        Ok(Self { k, ..self })
    }

    /// The rows of the head the screen stands for.
    fn head_rows(&self) -> usize {
        self.covered
            .as_ref()
            .map_or(self.copy.rows(), |c| c.vocab.vocab_size())
    }

    /// Refuses a head this screen was not built for (by shape).
    pub(crate) fn check_head(&self, head: &LmHead) -> Result<()> {
        let (n, cols) = head.dims()?;
        if (self.head_rows(), self.copy.cols()) != (n, cols) {
            bail!(
                "head_screen of [{}, {}] given an lm_head [{n}, {cols}]",
                self.head_rows(),
                self.copy.cols()
            );
        }
        Ok(())
    }

    /// Rows computed exactly per step.
    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// The bits a weight of the copy takes.
    pub(crate) fn bits(&self) -> ScreenBits {
        match *self.copy {
            RowCopy::Four(_) => ScreenBits::Four,
            RowCopy::Two { .. } => ScreenBits::Two,
        }
    }

    /// Bytes of the screen's rows (held beside the lm_head's).
    pub fn bytes(&self) -> usize {
        self.copy.bytes()
    }

    /// Bytes one step reads: the screen's rows of `vocab` (all without
    /// one), `k` of `head`'s rows, and those outside a covered vocabulary
    /// when the step is over every row.
    pub(crate) fn step_bytes(&self, head: &LmHead, vocab: Option<&OutputVocab>) -> usize {
        let rows = vocab
            .map_or(self.head_rows(), OutputVocab::rows)
            .min(self.copy.rows());
        let outside = match (&self.covered, vocab) {
            (Some(c), None) => c.outside.len(),
            _ => 0,
        };
        self.copy.bytes() * rows / self.copy.rows().max(1) + head.rows_bytes(self.k + outside)
    }

    /// The logits of one normed row `x`: the screen's over the rows of
    /// `vocab` (every row without one; the others −∞), the `k` best of
    /// them replaced by `head`'s exact logits (bias added). A screen of a
    /// covered vocabulary takes that vocabulary or every row (those outside
    /// it computed exactly).
    pub fn logits(
        &self,
        head: &LmHead,
        x: &[f32],
        vocab: Option<&OutputVocab>,
    ) -> Result<Vec<f32>> {
        let (n, cols) = head.dims()?;
        if x.len() != cols || self.head_rows() != n {
            bail!(
                "head_screen of {} rows over an lm_head [{n}, {cols}] given a row of {}",
                self.head_rows(),
                x.len()
            );
        }
        let mut y = vec![f32::NEG_INFINITY; n];
        // The rows scored by the copy: a vocabulary's, with their rows in
        // the copy (the extra rows follow a covered vocabulary's prefix).
        let scored = match (&self.covered, vocab) {
            (None, v) => v,
            (Some(c), None) => Some(&c.vocab),
            (Some(c), Some(v)) if c.vocab == *v => Some(v),
            (Some(c), Some(v)) => bail!(
                "head_screen holds the {} rows of one output vocabulary; a step asked for another of {} rows",
                c.vocab.rows(),
                v.rows()
            ),
        };
        match scored {
            Some(v) => {
                let mut ey = vec![0f32; v.extra().len()];
                let extra = match &self.covered {
                    Some(c) => &c.extra_in_copy[..],
                    None => v.extra(),
                };
                self.copy.scores(x, &mut y[..v.prefix()], extra, &mut ey);
                for (&e, v) in v.extra().iter().zip(ey) {
                    y[e as usize] = v;
                }
            }
            None => self.copy.scores(x, &mut y, &[], &mut []),
        }
        head.add_bias_to(&mut y)?;
        if let (Some(c), None) = (&self.covered, vocab) {
            for (&id, exact) in c.outside.iter().zip(head.forward_row_ids(x, &c.outside)?) {
                y[id as usize] = exact;
            }
        }
        let ids = top_k(&y, self.k);
        for (&id, exact) in ids.iter().zip(head.forward_row_ids(x, &ids)?) {
            y[id as usize] = exact;
        }
        Ok(y)
    }
}

/// The rows of `v` as runs of consecutive rows: its prefix, then its
/// extra rows.
fn row_runs(v: &OutputVocab) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<_> = std::iter::once(0..v.prefix()).collect();
    for &e in v.extra() {
        let e = e as usize;
        match runs.last_mut() {
            Some(r) if r.end == e => r.end += 1,
            _ => runs.push(e..e + 1),
        }
    }
    runs.retain(|r| !r.is_empty());
    runs
}

/// Bytes a screen in `bits` of an lm_head `[rows, cols]` holds (its
/// build's f32 rows, a load-time transient, are fewer than a prefill
/// chunk's temporaries, which a memory plan counts).
pub(crate) fn memory_bytes(rows: usize, cols: usize, bits: ScreenBits) -> u64 {
    (bits.row_bytes(cols) * rows) as u64
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

    fn head(rows: usize, cols: usize) -> LmHead {
        let w = Tensor::from_vec(data(rows * cols, 3), (rows, cols), &Device::Cpu).unwrap();
        LmHead::Held(crate::model::linear::Linear::new(w, None).unwrap())
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
        let all = HeadScreen::build(&head, n, ScreenBits::Four, None).unwrap();
        assert_eq!(all.logits(&head, &x, None).unwrap(), exact);
        let screen = HeadScreen::build(&head, 8, ScreenBits::Four, None).unwrap();
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
    fn a_clone_of_a_screen_shares_its_copy() {
        // The engine keeps the screen it puts in force for each request: a
        // copy of its rows per clone would hold them twice.
        let head = head(64, 32);
        let s = HeadScreen::build(&head, 4, ScreenBits::Two, None).unwrap();
        assert!(Arc::ptr_eq(&s.copy, &s.clone().copy));
    }

    #[test]
    fn a_screen_of_no_rows_or_more_rows_than_the_head_is_refused() {
        let head = head(40, 32);
        for k in [0, 41] {
            for bits in [ScreenBits::Four, ScreenBits::Two] {
                let e = HeadScreen::build(&head, k, bits, None)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("head_screen") && e.contains("40"), "{e}");
            }
        }
        let e = ScreenBits::from_bits(3).unwrap_err().to_string();
        assert!(e.contains("head_screen_bits") && e.contains('3'), "{e}");
        assert_eq!(ScreenBits::from_bits(2).unwrap(), ScreenBits::Two);
    }

    #[test]
    fn the_two_bit_copy_is_exact_with_every_row_and_within_its_rounding_otherwise() {
        // 576 columns: rows padded to whole 128-weight chunks.
        let (n, cols) = (300, 576);
        let head = head(n, cols);
        let x = data(cols, 7);
        let exact = head.forward_row(&x).unwrap();
        let all = HeadScreen::build(&head, n, ScreenBits::Two, None).unwrap();
        assert_eq!(all.logits(&head, &x, None).unwrap(), exact);
        assert_eq!(all.bits(), ScreenBits::Two);
        assert_eq!(all.bytes(), n * (cols.div_ceil(128) * 32 + 4));
        let screen = HeadScreen::build(&head, 64, ScreenBits::Two, None).unwrap();
        let got = screen.logits(&head, &x, None).unwrap();
        let best = |v: &[f32]| (0..n).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        assert_eq!(best(&got), best(&exact));
        // Each weight of the copy is within d of the row's (within its
        // level's reach, ±4d) or at most |w| - 3d off (clipped); the 8-bit
        // activations within |x|max/254 each.
        let w = data(n * cols, 3);
        let xmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let xsum: f32 = x.iter().map(|v| v.abs()).sum();
        let (mut inexact, rb) = (0, q2::row_bytes(cols));
        for (r, ((g, e), row)) in got.iter().zip(&exact).zip(w.chunks_exact(cols)).enumerate() {
            let mut codes = vec![0u8; rb];
            let d = q2::quantize_row(row, &mut codes).abs();
            let wmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let per_weight = d.max(wmax - 3.0 * d);
            let bound = xsum * per_weight + 3.0 * d * cols as f32 * xmax / 254.0 + 1e-4;
            assert!(
                (g - e).abs() <= bound,
                "row {r}: {g} vs {e} (bound {bound})"
            );
            inexact += usize::from(g != e);
        }
        assert!(inexact >= n - 64, "{inexact} rows from the copy");
    }

    /// A screen built over a vocabulary holds its rows only and scores
    /// them as the whole copy does; a step over every row computes the
    /// rows outside exactly; a step over another vocabulary is refused.
    #[test]
    fn a_screen_of_a_vocabulary_holds_its_rows_only() {
        for bits in [ScreenBits::Four, ScreenBits::Two] {
            let (n, cols) = (300, 64);
            let head = head(n, cols);
            let x = data(cols, 7);
            // A prefix and two runs of extra rows.
            let v = OutputVocab::new(n, 100, vec![150, 151, 152, 250, 299]).unwrap();
            let whole = HeadScreen::build(&head, 8, bits, None).unwrap();
            let part = HeadScreen::build(&head, 8, bits, Some(&v)).unwrap();
            assert_eq!(part.rows(), 105);
            assert_eq!(part.bytes() * n, whole.bytes() * 105, "{bits}: bytes");
            assert!(part.covers(Some(&v)) && !part.covers(None) && whole.covers(None));
            part.check_head(&head).unwrap();
            // Over the vocabulary: the whole copy's logits exactly.
            let want = whole.logits(&head, &x, Some(&v)).unwrap();
            assert_eq!(part.logits(&head, &x, Some(&v)).unwrap(), want, "{bits}");
            // Over every row: the vocabulary's rows the copy's scores (or
            // exact), every row outside it exact.
            let exact = head.forward_row(&x).unwrap();
            let got = part.logits(&head, &x, None).unwrap();
            let mut scored = vec![0f32; part.rows()];
            part.copy.scores(&x, &mut scored, &[], &mut []);
            let in_copy = (0..100).chain([150, 151, 152, 250, 299]);
            for (i, t) in in_copy.enumerate() {
                assert!(got[t] == scored[i] || got[t] == exact[t], "{bits}: row {t}");
            }
            for t in (0..n).filter(|&t| !v.contains(t as u32)) {
                assert_eq!(got[t], exact[t], "{bits}: row {t} outside");
            }
            let other = OutputVocab::new(n, 120, vec![]).unwrap();
            let e = part
                .logits(&head, &x, Some(&other))
                .unwrap_err()
                .to_string();
            assert!(e.contains("head_screen") && e.contains("120"), "{e}");
        }
    }
}
