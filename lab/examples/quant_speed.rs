//! Streams one SmolLM2-shaped token's quantized rows through the quantized
//! kernels alone (matvec over every row, one thread and the decode pool),
//! per block format, to see what they reach in GB/s.
//! Run: cargo run --release -p selectinfer-lab --example quant_speed
use selectinfer::kernels::quant::{self, Q8Act, QFormat};
use std::time::Instant;

/// The whole bundled SwiGLU MLP of Qwen2.5-0.5B's shape (hidden 896, 4864
/// neurons of Q5_0 gate/up rows and Q8_0 down rows, 24 layers: 255 MB, out
/// of cache), one token through every layer, the decode pool.
fn bundled_mlp() {
    use selectinfer::kernels::planar::{self, RowForm};
    use selectinfer::kernels::quant_mlp::{BundleLayout, DownForm};
    // BLOCKS=1: gate and up rows as whole blocks even where planar rows
    // are preferred (to compare the two).
    let rows = if planar::preferred() && std::env::var("BLOCKS").is_err() {
        RowForm::Planar
    } else {
        RowForm::Blocks
    };
    // CACHED=1: 256 neurons, one layer (in L2): the kernels' compute bound.
    // LAYERS=1: one layer (11 MB, in L3).
    let (h, n, layers) = if std::env::var("CACHED").is_ok() {
        (896usize, 256usize, 1usize)
    } else {
        (
            896,
            4864,
            std::env::var("LAYERS").map_or(24, |v| v.parse().unwrap()),
        )
    };
    let layout = BundleLayout {
        hidden: h,
        gate: QFormat::Q5_0,
        up: QFormat::Q5_0,
        down: QFormat::Q8_0,
        rows,
        down_form: DownForm::Rows,
    };
    // Bundles in quads where `Bundles::new` would store them so.
    let quads = rows == RowForm::Planar && selectinfer::kernels::quads::preferred();
    let layout = BundleLayout {
        down_form: if quads {
            DownForm::Quads
        } else {
            DownForm::Rows
        },
        ..layout
    };
    let bytes = layout.bundle_bytes() * n;
    let mats: Vec<Vec<u8>> = (0..layers)
        .map(|l| {
            let mut w: Vec<u8> = Vec::with_capacity(bytes);
            selectinfer::sys::hugepages::advise(w.as_ptr(), bytes);
            w.extend((0..bytes).map(|i| ((i + l) % 251) as u8 & 0x3f));
            // Finite scales: every 22-/34-byte block's first two bytes.
            let (g, d) = (layout.gate_bytes(), layout.down_bytes());
            for b in w.chunks_exact_mut(layout.bundle_bytes()) {
                for blk in b[..2 * g].chunks_exact_mut(22) {
                    blk[0] = 0;
                    blk[1] = 0x1c;
                }
                for blk in b[2 * g..2 * g + d].chunks_exact_mut(34) {
                    blk[0] = 0;
                    blk[1] = 0x1c;
                }
                if rows == RowForm::Planar {
                    planar::make_planar(layout.gate, h, &mut b[..2 * g]);
                }
            }
            if quads {
                selectinfer::kernels::quant_mlp::reform(&layout, &mut w, DownForm::Quads);
            }
            w
        })
        .collect();
    let x: Vec<f32> = (0..h).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let mut y = vec![0f32; h];
    let mut times = Vec::new();
    for _ in 0..if layers == 1 { 3000 } else { 30 } {
        let t = Instant::now();
        for m in &mats {
            selectinfer::kernels::quant_mlp::swiglu_bundles(&x, &layout, m, n, &mut y);
        }
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let total = (bytes * layers) as f64;
    println!(
        "bundled MLP (Qwen 0.5B shape, {:.0} MB, {rows:?} gate/up rows, {:?}): median {:.2} ms = {:.1} GB/s, best {:.1} GB/s ({})",
        total / 1e6,
        layout.down_form,
        times[times.len() / 2] * 1e3,
        total / times[times.len() / 2] / 1e9,
        total / times[0] / 1e9,
        y[3]
    );
}

fn main() {
    if std::env::var("MLP").is_ok() {
        return bundled_mlp();
    }
    use selectinfer::kernels::planar::{self, RowForm};
    let rows: usize = std::env::var("ROWS").map_or(200_000, |v| v.parse().unwrap());
    // H: the row length (default SmolLM2's 576: 18 blocks, two after the
    // last group of four of a planar row; Qwen 0.5B's 896 has none).
    let h: usize = std::env::var("H").map_or(576, |v| v.parse().unwrap());
    let form = if planar::preferred() && std::env::var("BLOCKS").is_err() {
        RowForm::Planar
    } else {
        RowForm::Blocks
    };
    let x: Vec<f32> = (0..h).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let xq = Q8Act::quantize(&x);
    for f in [QFormat::Q8_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q4_0] {
        let bytes = f.row_bytes(h) * rows;
        let mut w: Vec<u8> = Vec::with_capacity(bytes);
        selectinfer::sys::hugepages::advise(w.as_ptr(), bytes);
        w.extend((0..bytes).map(|i| (i % 251) as u8 & 0x3f));
        // Scales: keep them finite (small f16 values).
        let bb = f.block_bytes();
        for b in w.chunks_exact_mut(bb) {
            b[0] = 0x00;
            b[1] = 0x1c;
            if f == QFormat::Q4_1 {
                b[2] = 0;
                b[3] = 0x1c;
            }
        }
        let axpy_rows = w.clone();
        if form == RowForm::Planar {
            planar::make_planar(f, h, &mut w);
        }
        let mut out = vec![0f32; rows];
        let mut best = f64::MAX;
        let mut best1 = f64::MAX;
        for _ in 0..(4_000_000 / rows).max(20) {
            let t = Instant::now();
            quant::matvec_q(f, form, &w, &xq, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for (o, r) in out.iter_mut().zip(w.chunks_exact(f.row_bytes(h))) {
                *o = quant::dot_in(f, form, r, &xq);
            }
            best1 = best1.min(t.elapsed().as_secs_f64());
        }
        let mut y = vec![0f32; h];
        let mut besta = f64::MAX;
        for _ in 0..(2_000_000 / rows).max(10) {
            let t = Instant::now();
            for r in axpy_rows.chunks_exact(f.row_bytes(h)) {
                quant::axpy(f, 0.5, r, &mut y);
            }
            besta = besta.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{f} ({form:?}): matvec pool {:.1} GB/s, one thread {:.1} GB/s, axpy one thread {:.1} GB/s ({})",
            bytes as f64 / best / 1e9,
            bytes as f64 / best1 / 1e9,
            bytes as f64 / besta / 1e9,
            out[7] + y[3]
        );
    }
}
