//! The FFN block (SwiGLU MLP), stored neuron-major.
//!
//! Neuron `n` of a layer owns row `n` of `gate_proj`, row `n` of `up_proj`
//! and column `n` of `down_proj`. We keep `[gate; up]` as one `[2N, H]`
//! matrix and `down_proj` transposed to `[N, H]`, so every neuron is a set of
//! contiguous rows. A sub-network of neurons is then just a row selection of
//! the same three matrices (`Mlp::from_neuron_rows`), which is what selective
//! loading and computation build on. Decode runs the fused CPU kernels of
//! [`crate::kernels`]; prefill and non-CPU devices use candle matmuls.
//!
//! Selective computation does not copy a prompt's chosen neurons beside the
//! loaded ones: [`Mlp::arrange`] reorders the held rows (in place on the
//! CPU, so they stay on the huge pages they were loaded onto; layer by layer
//! elsewhere, so at most one layer's FFN is held twice) into a *front* segment of chosen
//! neurons and a *back* segment of the others, stored
//! `[gate_front; up_front; gate_back; up_back]`. Decode then runs on
//! [`Mlp::front`], a zero-copy view of the front rows, and the next prompt's
//! prefill still computes every held neuron from the same tensors.

mod load;
mod swap;

use crate::model::bundles::Bundles;
use crate::model::linear::{is_single_row, Linear};
use crate::model::rowread::RowSource;
use anyhow::{Context, Result};
use candle_core::{DType, Tensor, D};
use candle_nn::VarBuilder;

/// How an MLP's neurons are stored.
#[derive(Debug, Clone)]
enum Store {
    /// Tensors (f32/f16/bf16, any device).
    Rows {
        /// `[gate rows; up rows]`, shape `[2N, H]`.
        gate_up: Linear,
        /// `down_proj` transposed: neuron `n` is row `n`, shape `[N, H]`.
        down_t: Tensor,
    },
    /// Quantized neuron bundles (CPU).
    Bundles(Bundles),
}

/// Why a quantized MLP (bundles) refuses per-token gating.
pub(crate) const QUANTIZED_NOT_GATED: &str =
    "per-token gating (gate_keep < 1) runs on f32/f16 rows; quantized (q8/q4) bundles are not gated";

#[derive(Debug, Clone)]
pub(crate) struct Mlp {
    store: Store,
    width: usize,
    /// Original indices of the neurons held, when this is a subset, in
    /// *canonical* order (ascending, the order they were loaded in). A
    /// neuron's canonical position is its index here; selection works on
    /// canonical positions whatever the storage order.
    neurons: Option<Vec<u32>>,
    /// Storage order after [`Mlp::arrange`]: the canonical position of each
    /// stored row (`None`: canonical order).
    order: Option<Vec<u32>>,
    /// Rows in the front segment (`width` when not arranged).
    front: usize,
    /// Per-token gating of decode ([`Mlp::gated`]): per group of
    /// [`crate::kernels::GATE_GROUP`] neurons, how many run up and down.
    gate_keep: Option<usize>,
}

impl Mlp {
    /// Loads the dense MLP (all neurons) of one layer.
    pub(crate) fn load(vb: VarBuilder, hidden: usize, intermediate: usize) -> Result<Self> {
        let get = |name: &str, shape: (usize, usize)| {
            vb.get(shape, &format!("{name}.weight"))
                .with_context(|| format!("loading {}.{name}.weight", vb.prefix()))
        };
        let gate = get("gate_proj", (intermediate, hidden))?;
        let up = get("up_proj", (intermediate, hidden))?;
        let down = get("down_proj", (hidden, intermediate))?;
        Self::from_neuron_rows(&gate, &up, &down.t()?)
    }

    /// Builds an MLP from per-neuron rows: `gate [N, H]`, `up [N, H]`,
    /// `down_t [N, H]` (the transpose of `down_proj` restricted to the neurons).
    pub(crate) fn from_neuron_rows(gate: &Tensor, up: &Tensor, down_t: &Tensor) -> Result<Self> {
        let width = gate.dim(0)?;
        Ok(Self {
            store: Store::Rows {
                gate_up: Linear::new(Tensor::cat(&[gate, up], 0)?, None)?,
                down_t: down_t.contiguous()?,
            },
            width,
            neurons: None,
            order: None,
            front: width,
            gate_keep: None,
        })
    }

    /// An MLP over quantized neuron bundles; `neurons`: the original
    /// indices of the bundles (ascending), `None` when they are all of the layer's.
    pub(crate) fn from_bundles(bundles: Bundles, neurons: Option<Vec<u32>>) -> Result<Self> {
        let width = bundles.len();
        if let Some(ids) = &neurons {
            if ids.len() != width || ids.windows(2).any(|w| w[0] >= w[1]) {
                anyhow::bail!(
                    "{width} neuron bundles given {} neuron ids (ascending, one each)",
                    ids.len()
                );
            }
        }
        Ok(Self {
            store: Store::Bundles(bundles),
            width,
            neurons,
            order: None,
            front: width,
            gate_keep: None,
        })
    }

    /// The `[gate; up]` and `down_t` tensors (`None`: quantized bundles).
    #[cfg(test)]
    fn rows(&self) -> Option<(&Tensor, &Tensor)> {
        match &self.store {
            Store::Rows { gate_up, down_t } => Some((gate_up.dense_weight()?, down_t)),
            Store::Bundles(_) => None,
        }
    }

    /// An MLP holding no neuron (the placeholder of a layer whose FFN is
    /// streamed from disk at every forward pass).
    pub(crate) fn empty(hidden: usize, dtype: DType, device: &candle_core::Device) -> Result<Self> {
        let none = Tensor::zeros((0, hidden), dtype, device)?;
        let mut mlp = Self::from_neuron_rows(&none, &none, &none)?;
        mlp.neurons = Some(Vec::new());
        Ok(mlp)
    }

    /// Rows of `[gate; up]` holding stored row `p`'s gate and up weights.
    fn gate_up_rows(&self, p: usize) -> (u32, u32) {
        let (s, back) = (self.front, self.width - self.front);
        let (g, u) = if p < s {
            (p, s + p)
        } else {
            (2 * s + (p - s), 2 * s + back + (p - s))
        };
        // Row indices are u32 like every neuron index here (widths ≪ 2^32).
        (g as u32, u as u32)
    }

    /// The stored row of each canonical position (the inverse of `order`).
    fn stored_rows(&self) -> Vec<u32> {
        let mut stored: Vec<u32> = (0..self.width as u32).collect();
        if let Some(order) = &self.order {
            for (row, &c) in order.iter().enumerate() {
                stored[c as usize] = row as u32;
            }
        }
        stored
    }

    /// The stored row of each canonical position, `None` in canonical order
    /// (what selection reads prefill's activations through).
    pub(crate) fn stored_order(&self) -> Option<Vec<u32>> {
        self.order.as_ref().map(|_| self.stored_rows())
    }

    /// Stores the same neurons with canonical positions `front` (ascending,
    /// no duplicates) first: `[gate_front; up_front; gate_back; up_back]`
    /// and `down_t [front; back]`, each segment in canonical order.
    ///
    /// On the CPU the rows move in place, in the storage loaded (and put
    /// on huge pages, [`crate::sys::hugepages`]) at load time, one row of
    /// scratch ([`crate::kernels::permute_rows_in_place`]; bundles likewise):
    /// no copy of the layer is made. Elsewhere the MLP gets the new buffers and the old
    /// ones are freed. Clones of an `Mlp` share its storage, so arrange only
    /// an MLP no one else holds (a model's own; [`Mlp::front`]'s views are
    /// the next prompt's to replace).
    pub(crate) fn arrange(&mut self, front: &[usize]) -> Result<()> {
        let w = self.width;
        if let Some(&bad) = front.iter().find(|&&p| p >= w) {
            anyhow::bail!("neuron position {bad} out of range ({w} held)");
        }
        if front.windows(2).any(|p| p[0] >= p[1]) {
            anyhow::bail!("front neuron positions must be ascending without duplicates");
        }
        let stored = self.stored_rows();
        let mut in_front = vec![false; w];
        front.iter().for_each(|&p| in_front[p] = true);
        let order: Vec<u32> = front
            .iter()
            .map(|&p| p as u32)
            .chain((0..w as u32).filter(|&c| !in_front[c as usize]))
            .collect();
        let src: Vec<usize> = order.iter().map(|&c| stored[c as usize] as usize).collect();
        let (head, tail) = src.split_at(front.len());
        let mut gate_up_rows: Vec<u32> = Vec::with_capacity(2 * w);
        for part in [head, tail] {
            let (gate, up): (Vec<u32>, Vec<u32>) =
                part.iter().map(|&p| self.gate_up_rows(p)).unzip();
            gate_up_rows.extend(gate);
            gate_up_rows.extend(up);
        }
        let down_rows: Vec<u32> = src.iter().map(|&p| p as u32).collect();
        match &mut self.store {
            Store::Bundles(b) => b.permute(&src)?,
            Store::Rows { gate_up, down_t } => {
                let gu = gate_up
                    .dense_weight()
                    .context("an MLP's gate/up rows are a tensor")?;
                if down_t.device().is_cpu() {
                    // In place where the matrices allow it (no copy); else one
                    // matrix at a time: at most one gathered copy is alive.
                    for (t, rows) in [(gu, &gate_up_rows), (&*down_t, &down_rows)] {
                        if !crate::kernels::permute_rows_in_place(t, rows)? {
                            t.slice_set(&crate::kernels::gather_rows(t, rows)?, 0, 0)?;
                        }
                    }
                } else {
                    let gu = crate::kernels::gather_rows(gu, &gate_up_rows)?;
                    *down_t = crate::kernels::gather_rows(down_t, &down_rows)?;
                    *gate_up = Linear::new(gu, None)?;
                }
            }
        }
        self.order = (front.len() != w).then_some(order);
        self.front = front.len();
        Ok(())
    }

    /// Stores the neurons in canonical order again, as loaded (after
    /// [`Mlp::arrange`]; a no-op on an MLP in that order).
    pub(crate) fn unarrange(&mut self) -> Result<()> {
        match self.order {
            Some(_) => self.arrange(&(0..self.width).collect::<Vec<_>>()),
            None => Ok(()),
        }
    }

    /// Whether [`Mlp::arrange`] moves the neurons within their own buffer,
    /// with no copy of the layer: bundles always; rows where both matrices
    /// permute in place ([`crate::kernels::gather::permutes_in_place`];
    /// else a gathered copy per matrix).
    pub(crate) fn arranges_in_place(&self) -> bool {
        use crate::kernels::gather::permutes_in_place;
        match &self.store {
            Store::Bundles(_) => true,
            Store::Rows { gate_up, down_t } => gate_up
                .dense_weight()
                .is_some_and(|g| permutes_in_place(g) && permutes_in_place(down_t)),
        }
    }

    /// The front segment as an MLP of its own: views of the stored rows, no
    /// copy. What decode runs on after [`Mlp::arrange`].
    pub(crate) fn front(&self) -> Result<Self> {
        let Some(order) = &self.order else {
            return Ok(self.clone());
        };
        let s = self.front;
        let ids = order[..s].iter().map(|&c| match &self.neurons {
            Some(held) => held[c as usize],
            None => c,
        });
        let store = match &self.store {
            Store::Bundles(b) => Store::Bundles(b.prefix(s)),
            Store::Rows { gate_up, down_t } => Store::Rows {
                gate_up: Linear::new(
                    gate_up
                        .dense_weight()
                        .context("an MLP's gate/up rows are a tensor")?
                        .narrow(0, 0, 2 * s)?,
                    None,
                )?,
                down_t: down_t.narrow(0, 0, s)?,
            },
        };
        Ok(Self {
            store,
            width: s,
            neurons: Some(ids.collect()),
            order: None,
            front: s,
            gate_keep: None,
        })
    }

    /// This MLP with per-token gating: each decode token runs up and down
    /// for only the `keep` neurons of each group of
    /// [`crate::kernels::GATE_GROUP`] with the largest |silu(gate)|
    /// (`None`: every neuron). f32/f16 rows only.
    pub(crate) fn gated(mut self, keep: Option<usize>) -> Result<Self> {
        if let Some(k) = keep {
            if matches!(self.store, Store::Bundles(_)) {
                anyhow::bail!(QUANTIZED_NOT_GATED);
            }
            if self.order.is_some() {
                anyhow::bail!(
                    "per-token gating applies to an MLP in canonical order (a front view)"
                );
            }
            if !(1..=crate::kernels::GATE_GROUP).contains(&k) {
                anyhow::bail!(
                    "gating keeps 1..={} neurons per group, got {k}",
                    crate::kernels::GATE_GROUP
                );
            }
        }
        self.gate_keep = keep;
        Ok(self)
    }

    /// `‖down_j‖₂` of each held neuron (its output's weight norm), in
    /// canonical order.
    pub(crate) fn down_norms(&self) -> Result<Vec<f32>> {
        let stored = match &self.store {
            Store::Rows { down_t, .. } => down_t.to_dtype(DType::F32)?.sqr()?.sum(1)?.sqrt()?,
            Store::Bundles(b) => Tensor::new(b.down_norms(), &candle_core::Device::Cpu)?,
        };
        Ok(self.to_canonical(&stored)?.to_vec1()?)
    }

    /// Activations `a [.., N]` in storage order → canonical order (what
    /// selection works on).
    pub(crate) fn to_canonical(&self, a: &Tensor) -> Result<Tensor> {
        if self.order.is_none() {
            return Ok(a.clone());
        }
        let idx = Tensor::new(self.stored_rows(), a.device())?;
        Ok(a.index_select(&idx, a.rank() - 1)?)
    }

    /// Loads every neuron of layer `prefix` with `pread` (the dense MLP).
    pub(crate) fn load_all(
        source: &RowSource,
        prefix: &str,
        intermediate: usize,
        hidden: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        for (part, want) in [
            ("gate_proj", [intermediate, hidden]),
            ("up_proj", [intermediate, hidden]),
            ("down_proj", [hidden, intermediate]),
        ] {
            let name = format!("{prefix}.{part}.weight");
            let got = &source.find(&name)?.entry(&name)?.shape;
            if got[..] != want {
                anyhow::bail!("{name} has shape {got:?}, the model config expects {want:?}");
            }
        }
        let all: Vec<u32> = (0..intermediate as u32).collect();
        let mut mlp = Self::load_neurons(source, prefix, &all, hidden, dtype, device)?;
        mlp.neurons = None;
        Ok(mlp)
    }

    /// Original indices of the neurons held (`None`: all, in order).
    pub(crate) fn neurons(&self) -> Option<&[u32]> {
        self.neurons.as_deref()
    }

    /// Number of neurons this MLP computes.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Moves the weights onto huge pages ([`crate::sys::hugepages`]).
    pub(crate) fn collapse_to_huge_pages(&self) {
        match &self.store {
            Store::Rows { gate_up, down_t } => {
                gate_up.collapse_to_huge_pages();
                crate::sys::hugepages::collapse_tensor(down_t);
            }
            Store::Bundles(b) => b.collapse_to_huge_pages(),
        }
    }

    /// Bytes of weights read per token.
    pub(crate) fn weight_bytes(&self) -> usize {
        match &self.store {
            Store::Rows { gate_up, down_t } => {
                gate_up.weight_bytes() + down_t.elem_count() * down_t.dtype().size_in_bytes()
            }
            Store::Bundles(b) => b.bytes(),
        }
    }

    /// The input of `down_proj`: `silu(gate(x)) * up(x)`, shape `[.., N]`,
    /// f32, in storage order ([`Mlp::to_canonical`] reorders it).
    pub(crate) fn activations(&self, x: &Tensor) -> Result<Tensor> {
        let gate_up = match &self.store {
            Store::Bundles(b) => return b.activations(x),
            Store::Rows { gate_up, .. } => gate_up,
        };
        let gu = gate_up.forward(x)?;
        let swiglu = |start: usize, n: usize| -> Result<Tensor> {
            let gate = gu.narrow(D::Minus1, start, n)?;
            let up = gu.narrow(D::Minus1, start + n, n)?;
            Ok((candle_nn::ops::silu(&gate)? * up)?)
        };
        let (s, back) = (self.front, self.width - self.front);
        if let Some(keep) = self.gate_keep {
            return self.gated_activations(&gu, keep);
        }
        if self.order.is_none() || back == 0 {
            return swiglu(0, self.width);
        }
        if s == 0 {
            return swiglu(0, back);
        }
        Ok(Tensor::cat(
            &[swiglu(0, s)?, swiglu(2 * s, back)?],
            D::Minus1,
        )?)
    }

    /// The activations of a gated MLP from its `gate_up` output `[.., 2N]`:
    /// per row, the neurons [`crate::kernels::gate_keep_mask`] drops are 0
    /// (what the gated decode kernel computes, batched).
    fn gated_activations(&self, gu: &Tensor, keep: usize) -> Result<Tensor> {
        use crate::kernels::{gate_keep_mask, group_keep, GATE_GROUP};
        let n = self.width;
        let dims = gu.dims().to_vec();
        let rows = gu
            .to_dtype(DType::F32)?
            .reshape(((), 2 * n))?
            .to_vec2::<f32>()?;
        let mut out = Vec::with_capacity(rows.len() * n);
        let mut mask = Vec::new();
        for row in &rows {
            let (gate, up) = row.split_at(n);
            for (g, u) in gate.chunks(GATE_GROUP).zip(up.chunks(GATE_GROUP)) {
                gate_keep_mask(g, group_keep(keep, g.len()), &mut mask);
                out.extend(g.iter().zip(u).zip(&mask).map(|((&g, &u), &on)| match on {
                    true => g / (1.0 + (-g).exp()) * u,
                    false => 0.0,
                }));
            }
        }
        let mut shape = dims;
        *shape
            .last_mut()
            .expect("gate_up output has a last dimension") = n;
        Ok(Tensor::from_vec(out, shape, gu.device())?)
    }

    /// `down_proj` applied to activations `a [.., N]` → `[.., H]`, f32.
    pub(crate) fn down(&self, a: &Tensor) -> Result<Tensor> {
        let down_t = match &self.store {
            // Summed in canonical order, wherever the last prompt's
            // arrangement left the neurons: a prompt's prefill (and so its
            // selection and reply) does not depend on the prompt before.
            Store::Bundles(b) if self.order.is_some() && a.device().is_cpu() => {
                return b.down_in_order(a, Some(&self.stored_rows()));
            }
            Store::Bundles(b) => return b.down(a),
            Store::Rows { down_t, .. } => down_t,
        };
        let a = a.to_dtype(down_t.dtype())?;
        let (lead, n) = (a.dims()[..a.rank() - 1].to_vec(), self.width);
        let y = a.reshape(((), n))?.matmul(down_t)?;
        let mut dims = lead;
        dims.push(down_t.dim(1)?);
        Ok(y.reshape(dims)?.to_dtype(DType::F32)?)
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if is_single_row(x) && x.device().is_cpu() {
            let y = self.forward_row(&x.flatten_all()?.to_vec1::<f32>()?)?;
            return Ok(Tensor::from_vec(y, x.shape(), x.device())?);
        }
        self.down(&self.activations(x)?)
    }

    /// One row on the CPU, `x [H]` → `[H]`: the fused SwiGLU kernel
    /// ([`crate::kernels::swiglu_mlp`]) when the rows are in canonical
    /// order (a dense MLP, a subset, or an arranged MLP's [`Mlp::front`]).
    pub(crate) fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        let (gate_up, down_t) = match &self.store {
            // Bundles hold each neuron whole: any storage order sums the same.
            Store::Bundles(b) => return b.forward_row(x),
            Store::Rows { gate_up, down_t } => (gate_up, down_t),
        };
        if self.order.is_some() {
            let t = Tensor::from_slice(x, (1, x.len()), &candle_core::Device::Cpu)?;
            return Ok(self
                .down(&self.activations(&t)?)?
                .flatten_all()?
                .to_vec1()?);
        }
        let mut y = vec![0f32; x.len()];
        let gate_up = gate_up
            .dense_weight()
            .context("an MLP's gate/up rows are a tensor")?;
        crate::kernels::with_weight(gate_up, |gate_up| {
            crate::kernels::with_weight(down_t, |down_t| {
                crate::kernels::swiglu_mlp_weights(x, &gate_up, &down_t, &mut y, self.gate_keep)
            })
        })?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// Address of the first element of a contiguous CPU f32 tensor.
    fn data_ptr(t: &Tensor) -> *const f32 {
        let (storage, layout) = t.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => {
                v[layout.start_offset()..].as_ptr()
            }
            _ => panic!("expected CPU f32 storage"),
        }
    }

    pub(super) fn random_mlp(n: usize, h: usize) -> Mlp {
        let dev = Device::Cpu;
        let r = |seed: f64| {
            Tensor::arange(0f32, (n * h) as f32, &dev)
                .unwrap()
                .affine(0.37, seed)
                .unwrap()
                .sin()
                .unwrap()
                .reshape((n, h))
                .unwrap()
        };
        Mlp::from_neuron_rows(&r(0.1), &r(0.7), &r(1.3)).unwrap()
    }

    #[test]
    fn arranged_mlp_computes_the_same_and_its_front_is_the_chosen_rows() {
        let (n, h) = (24, 8);
        let mlp = random_mlp(n, h);
        let x = Tensor::arange(0f32, (3 * h) as f32, &Device::Cpu)
            .unwrap()
            .affine(0.05, -0.4)
            .unwrap()
            .reshape((1, 3, h))
            .unwrap();
        let dense_a = mlp.activations(&x).unwrap();
        let dense_y = mlp.forward(&x).unwrap();
        // Its own storage: arranging rewrites the rows in place.
        let mut held = random_mlp(n, h);
        let storage = (
            data_ptr(held.rows().unwrap().0),
            data_ptr(held.rows().unwrap().1),
        );
        // Arrange twice, so the second works from an arranged layout.
        for front in [vec![1usize, 4, 5, 17, 23], vec![0, 4, 9, 10, 11, 17, 20]] {
            held.arrange(&front).unwrap();
            // In place, on the CPU: the loaded storage keeps its pages.
            assert_eq!(
                (
                    data_ptr(held.rows().unwrap().0),
                    data_ptr(held.rows().unwrap().1)
                ),
                storage
            );
            // Every held neuron still computes, in any storage order.
            let a = held.to_canonical(&held.activations(&x).unwrap()).unwrap();
            assert!(max_diff(&a, &dense_a) < 1e-5);
            assert!(max_diff(&held.forward(&x).unwrap(), &dense_y) < 1e-4);
            // The front computes exactly the chosen neurons.
            let f = held.front().unwrap();
            assert_eq!(f.width(), front.len());
            let ids: Vec<u32> = front.iter().map(|&p| p as u32).collect();
            assert_eq!(f.neurons(), Some(&ids[..]));
            let want = dense_a
                .index_select(&Tensor::new(ids.as_slice(), &Device::Cpu).unwrap(), 2)
                .unwrap();
            assert!(max_diff(&f.activations(&x).unwrap(), &want) < 1e-5);
            let y = f.forward(&x.narrow(1, 2, 1).unwrap()).unwrap();
            let want_y = f.down(&want.narrow(1, 2, 1).unwrap()).unwrap();
            assert!(max_diff(&y, &want_y) < 1e-4);
            // Views, not copies: the front's weights are the held storage.
            assert_eq!(
                data_ptr(f.rows().unwrap().0),
                data_ptr(held.rows().unwrap().0)
            );
            assert_eq!(
                data_ptr(f.rows().unwrap().1),
                data_ptr(held.rows().unwrap().1)
            );
        }
        assert!(held.arrange(&[3, 3]).is_err());
        assert!(held.arrange(&[n]).is_err());
        // Choosing every neuron gives back the canonical layout.
        let all: Vec<usize> = (0..n).collect();
        held.arrange(&all).unwrap();
        assert!(held.order.is_none());
        assert_eq!(max_diff(&held.forward(&x).unwrap(), &dense_y), 0.0);
    }

    #[test]
    fn arranged_bundles_move_whole_neurons_in_place_and_compute_the_same() {
        use crate::kernels::planar::RowForm;
        use crate::kernels::quant::QFormat;
        use crate::kernels::quant_mlp::{BundleLayout, DownForm};
        use crate::kernels::test_data::quantize_rows;
        let (n, h) = (24, 64);
        let layout = BundleLayout {
            hidden: h,
            gate: QFormat::Q4_1,
            up: QFormat::Q4_1,
            down: QFormat::Q8_0,
            rows: RowForm::Blocks,
            down_form: DownForm::Rows,
        };
        let rows =
            |seed: u32, f| quantize_rows(&crate::kernels::test_data::data(n * h, seed), h, f);
        let (g, u, d) = (
            rows(1, layout.gate),
            rows(2, layout.up),
            rows(3, layout.down),
        );
        let (gb, ub, db) = (layout.gate_bytes(), layout.up_bytes(), layout.down_bytes());
        let mut bytes = Vec::new();
        for i in 0..n {
            bytes.extend_from_slice(&g[i * gb..(i + 1) * gb]);
            bytes.extend_from_slice(&u[i * ub..(i + 1) * ub]);
            bytes.extend_from_slice(&d[i * db..(i + 1) * db]);
        }
        let make =
            || Mlp::from_bundles(Bundles::new(layout, bytes.clone()).unwrap(), None).unwrap();
        let dense = make();
        let x = Tensor::arange(0f32, (2 * h) as f32, &Device::Cpu)
            .unwrap()
            .affine(0.01, -0.5)
            .unwrap()
            .reshape((1, 2, h))
            .unwrap();
        let (dense_a, dense_y) = (dense.activations(&x).unwrap(), dense.forward(&x).unwrap());
        let row: Vec<f32> = x
            .narrow(1, 1, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let dense_row = dense.forward_row(&row).unwrap();
        let mut held = make();
        for front in [vec![1usize, 4, 5, 17, 23], vec![0, 4, 9, 10, 11, 17, 20]] {
            held.arrange(&front).unwrap();
            let a = held.to_canonical(&held.activations(&x).unwrap()).unwrap();
            assert!(max_diff(&a, &dense_a) < 1e-5);
            assert!(max_diff(&held.forward(&x).unwrap(), &dense_y) < 1e-4);
            // Decode sums whole bundles: any storage order, the same row
            // (up to the rounding of four neurons' coefficients where the
            // bundles are in quads, which depends on which four share one).
            // Measured: 0.034 against a largest output of 13.1.
            let y = held.forward_row(&row).unwrap();
            let top = dense_row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let tol = if crate::kernels::quads::preferred() {
                1e-2 * top
            } else {
                1e-4
            };
            assert!(y.iter().zip(&dense_row).all(|(a, b)| (a - b).abs() < tol));
            let f = held.front().unwrap();
            let ids: Vec<u32> = front.iter().map(|&p| p as u32).collect();
            assert_eq!(f.neurons(), Some(&ids[..]));
            let want = dense_a
                .index_select(&Tensor::new(ids.as_slice(), &Device::Cpu).unwrap(), 2)
                .unwrap();
            assert!(max_diff(&f.activations(&x).unwrap(), &want) < 1e-5);
            assert_eq!(f.weight_bytes(), front.len() * layout.bundle_bytes());
        }
    }
}
