//! `selectinfer_plot`: the retention/speed-up plot of fidelity runs
//! (`selectinfer fidelity --json` files) as a PNG. Build with
//! `cargo run --release -p selectinfer-lab --bin selectinfer_plot`.

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    about = "Plot top-1 agreement against decode speed-up from `selectinfer fidelity --json` files"
)]
struct Args {
    /// Fidelity JSON files (each with a mode=dense candidate).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    #[arg(
        long,
        default_value = "Selective computation: retention against speed-up"
    )]
    title: String,
    /// A TrueType font for the text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let files: Vec<&std::path::Path> = a.inputs.iter().map(PathBuf::as_path).collect();
    let points = selectinfer_lab::plot::points(&files)?;
    for p in &points {
        println!(
            "{:<60} speed-up {:.2}x  top-1 {:.3}  KL {:.3}",
            p.name, p.speedup, p.agreement, p.mean_kl
        );
    }
    selectinfer_lab::plot::draw(&points, &a.title, &a.font, &a.out)?;
    println!("{}", a.out.display());
    Ok(())
}
