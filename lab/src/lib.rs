//! The research bench, apart from the product crate (which it uses through
//! its public API only): the fidelity instrument's retention/speed-up plot
//! ([`plot`], binary `selectinfer_plot`, plotters). The bench's scripts are
//! in `lab/scripts` (see lab/README.md).

pub mod plot;
