//! The lm_head's screen (`selectinfer::model::head_screen`) on Qwen2.5-0.5B's
//! real lm_head (151,936 × 896, f16), its copy in 4 bits (`Q4_0`) against
//! 2 bits, alternated in one process: ms per decode step's logits (the
//! copy's scores over every row, then `K` rows exact), and the exact head.
//! Run (after `selectinfer prepare-model qwen2.5-coder-0.5b-instruct`):
//! cargo run --release -p selectinfer-lab --example screen_speed [MODEL_DIR] [K4] [K2]
use selectinfer::kernels::spin_pool::SpinPool;
use selectinfer::model::{HeadScreen, Linear, LmHead, ScreenBits};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .map_or("models/qwen2.5-coder-0.5b-instruct", |s| s);
    let k4: usize = args.get(2).map_or(Ok(64), |s| s.parse())?;
    let k2: usize = args.get(3).map_or(Ok(256), |s| s.parse())?;
    let st = candle_core::safetensors::load(
        format!("{dir}/model.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let w = st
        .get("lm_head.weight")
        .or_else(|| st.get("model.embed_tokens.weight"))
        .expect("an lm_head")
        .to_dtype(candle_core::DType::F16)?;
    drop(st);
    let (n, h) = w.dims2()?;
    let head = LmHead::Held(Linear::new(w, None)?);
    let t = Instant::now();
    let s4 = HeadScreen::build(&head, k4, ScreenBits::Four, None)?;
    let b4 = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let s2 = HeadScreen::build(&head, k2, ScreenBits::Two, None)?;
    println!(
        "built in {b4:.1} s (4-bit) and {:.1} s (2-bit)",
        t.elapsed().as_secs_f64()
    );
    println!(
        "lm_head [{n}, {h}] f16: copies of {:.1} MB (4-bit) and {:.1} MB (2-bit)",
        s4.bytes() as f64 / 1e6,
        s2.bytes() as f64 / 1e6
    );
    let x: Vec<f32> = (0..h)
        .map(|i| ((i * 7919 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let _ = SpinPool::global();
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..60 {
        for which in 0..3 {
            let which = (which + round) % 3;
            let t = Instant::now();
            let y = match which {
                0 => s4.logits(&head, &x, None)?,
                1 => s2.logits(&head, &x, None)?,
                _ => head.forward_row(&x)?,
            };
            std::hint::black_box(y);
            times[which].push(t.elapsed().as_secs_f64());
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e3
    };
    let [a, b, c] = &mut times;
    println!(
        "median ms per step: 4-bit copy + {k4} exact {:.2} | 2-bit copy + {k2} exact {:.2} | exact head {:.2}",
        med(a),
        med(b),
        med(c)
    );
    Ok(())
}
