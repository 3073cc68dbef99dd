//! The retention/speed-up plot of `selectinfer_plot`:
//! for each selection method, top-1 agreement with dense (mean over tasks)
//! against the decode speed-up its bytes per token give over dense, from
//! the JSON that `selectinfer fidelity --json` writes.

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// One candidate of a fidelity run: its name and per-task figures.
#[derive(serde::Deserialize)]
struct Column(String, Vec<selectinfer::tools::fidelity::TaskFidelity>);

/// A point of the plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The candidate's description (`mode=…,phi=…`).
    pub name: String,
    /// Dense's bytes per decode token / the candidate's.
    pub speedup: f64,
    /// Top-1 agreement with dense, mean over tasks.
    pub agreement: f64,
    pub mean_kl: f64,
}

/// The method a candidate description names: mode, score and gating (its
/// budget knobs φ, γ, κ set the point on the curve, not the method).
pub fn method_of(name: &str) -> String {
    let get = |key: &str| {
        name.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let mode = get("mode").unwrap_or_else(|| "dense".into());
    let score = get("score").unwrap_or_else(|| "counts".into());
    let gated = get("keep").is_some_and(|k| k.parse::<f64>().is_ok_and(|k| k < 1.0));
    let gamma = get("gamma").map(|g| format!(" γ{g}")).unwrap_or_default();
    let every = get("phi").is_some_and(|p| p.parse::<f64>().is_ok_and(|p| p >= 1.0));
    // The output layer's and the budgets' knobs that change the method.
    let mut extra = String::new();
    if let Some(v) = get("vocab").filter(|v| v != "all") {
        extra += &format!(" + vocab {v}");
    }
    if get("drop").or(get("layer_drop")).is_some() {
        extra += " + layer_drop";
    }
    if get("screen")
        .or(get("head_screen"))
        .is_some_and(|k| k.parse::<usize>().is_ok_and(|k| k > 0))
    {
        extra += " + head_screen";
        if get("sbits").or(get("head_screen_bits")).as_deref() == Some("2") {
            extra += " 2-bit";
        }
    }
    let method: String = match (mode.as_str(), gated) {
        ("dense", _) => "dense".into(),
        ("coreinfer", true) if every => "per-token gate alone (every neuron's gate)".into(),
        ("coreinfer", false) if score == "counts" => "coreinfer (paper's counts, full load)".into(),
        ("selectinfer", false) if score == "counts" => format!("selectinfer{gamma} (the paper's)"),
        (m, false) => format!("{m}{gamma} {score}"),
        (m, true) => format!("{m}{gamma} {score} + per-token gate"),
    };
    method + &extra
}

/// The points of fidelity JSON files; the speed-up is against the file's
/// plain `mode=dense` candidate (every output row exact, no vocabulary).
pub fn points(files: &[&Path]) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let cols: Vec<Column> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not the JSON of `selectinfer fidelity --json`",
                f.display()
            )
        })?;
        let mean = |c: &Column, v: fn(&selectinfer::tools::fidelity::TaskFidelity) -> f64| {
            c.1.iter().map(v).sum::<f64>() / c.1.len().max(1) as f64
        };
        let dense = cols
            .iter()
            .find(|c| method_of(&c.0) == "dense")
            .with_context(|| {
                format!(
                    "{}: no mode=dense candidate to measure speed-ups by",
                    f.display()
                )
            })?;
        let dense_bytes = mean(dense, |t| t.decode_bytes_per_token);
        for c in &cols {
            out.push(Point {
                name: c.0.clone(),
                speedup: dense_bytes / mean(c, |t| t.decode_bytes_per_token),
                agreement: mean(c, |t| t.top1_agreement),
                mean_kl: mean(c, |t| t.mean_kl),
            });
        }
    }
    Ok(out)
}

/// Draws `points` (one series per [`method_of`]) into a PNG at `out`,
/// with text in the TrueType font `font`.
pub fn draw(points: &[Point], title: &str, font: &Path, out: &Path) -> Result<()> {
    let bytes =
        std::fs::read(font).with_context(|| format!("reading the font {}", font.display()))?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("{} is not a TrueType font", font.display()))?;
    if points.is_empty() {
        bail!("nothing to plot");
    }
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        series
            .entry(method_of(&p.name))
            .or_default()
            .push((p.speedup, p.agreement));
    }
    let x_max = points.iter().map(|p| p.speedup).fold(1.0, f64::max) * 1.05;
    let y_min = points
        .iter()
        .map(|p| p.agreement)
        .fold(1.0, f64::min)
        .min(0.9)
        - 0.05;
    let root = BitMapBackend::new(out, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.95..x_max, y_min..1.01)?;
    chart
        .configure_mesh()
        .x_desc("decode speed-up over dense (bytes per token, same dtype)")
        .y_desc("top-1 agreement with dense (mean of tasks)")
        .label_style(("sans-serif", 16))
        .draw()?;
    // The bars: agreement ≥ 0.90 at ≥ 1.4×.
    let bar = RED.mix(0.5).stroke_width(2);
    chart.draw_series(LineSeries::new([(1.4, y_min), (1.4, 1.01)], bar))?;
    chart.draw_series(LineSeries::new([(0.95, 0.9), (x_max, 0.9)], bar))?;
    for (i, (method, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(method)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_candidate_description_names_its_method_not_its_budget() {
        use super::method_of;
        assert_eq!(method_of("mode=dense"), "dense");
        assert_eq!(
            method_of("mode=selectinfer,phi=0.4"),
            "selectinfer (the paper's)"
        );
        assert_eq!(
            method_of("mode=coreinfer,phi=0.5,score=wina"),
            "coreinfer wina"
        );
        assert_eq!(
            method_of("mode=coreinfer,phi=0.8,score=wina,keep=0.5"),
            "coreinfer wina + per-token gate"
        );
        assert_eq!(
            method_of("mode=coreinfer,phi=0.8,keep=1"),
            "coreinfer (paper's counts, full load)"
        );
        assert_eq!(method_of("mode=dense,screen=64"), "dense + head_screen");
        assert_eq!(
            method_of("mode=dense,screen=256,sbits=2"),
            "dense + head_screen 2-bit"
        );
        assert_eq!(method_of("mode=dense,screen=0,vocab=all"), "dense");
        assert_eq!(
            method_of("mode=coreinfer,phi=0.85,score=wina,vocab=latin,screen=64,drop=0:1"),
            "coreinfer wina + vocab latin + layer_drop + head_screen"
        );
    }
}
