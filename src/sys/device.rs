//! Compute devices: parsing a device name, the weight dtypes and which of
//! them a device takes, and how much device memory is in use.
//!
//! The model code is device-generic (candle tensors); only the single-row
//! CPU kernels in [`crate::kernels`] are CPU-specific, and callers fall back
//! to candle ops elsewhere. CUDA support needs the `cuda` cargo feature.

use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// Weight dtype in memory or on disk, as the CLI, the node and
/// `config.json` name it (`f32`, `f16`, `bf16`, and the quantized `q8`, `q4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    F32,
    F16,
    /// bf16: CUDA devices of compute capability ≥ 8.0 only (never CPU compute).
    Bf16,
    /// ggml's Q8_0 blocks everywhere (CPU).
    Q8,
    /// Each tensor's own 4/5/8-bit GGUF blocks where the neuron-major layout
    /// keeps them, requantized rows elsewhere (CPU; see `store::quantize`).
    Q4,
}

/// The quantized dtypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    Q8,
    Q4,
}

crate::sys::named::impl_named!(Quant, "quantized dtype", { Q8 => "q8", Q4 => "q4" });

impl WeightDtype {
    /// The candle dtype of the tensors: the weights', or f32 (norms,
    /// biases, prefill's dequantized rows) for the quantized dtypes.
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 | Self::Q8 | Self::Q4 => DType::F32,
            Self::F16 => DType::F16,
            Self::Bf16 => DType::BF16,
        }
    }

    /// `Some` for the quantized dtypes.
    pub fn quant(self) -> Option<Quant> {
        match self {
            Self::Q8 => Some(Quant::Q8),
            Self::Q4 => Some(Quant::Q4),
            _ => None,
        }
    }

    /// Refuses the quantized dtypes where only a tensor dtype fits (`what`).
    pub fn tensor_dtype(self, what: &str) -> Result<DType> {
        if self.quant().is_some() {
            bail!("{what} takes f32, f16 or bf16, not {}", self.name());
        }
        Ok(self.dtype())
    }
}

crate::sys::named::impl_named!(WeightDtype, "dtype", {
    F32 => "f32", F16 => "f16", Bf16 => "bf16", Q8 => "q8", Q4 => "q4"
});

/// Parses `cpu` or `cuda:N` (`cuda` = `cuda:0`).
pub(crate) fn parse_device(name: &str) -> Result<Device> {
    let name = name.trim();
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name {
        "cuda" => Some(0),
        _ => name
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(ordinal) = ordinal else {
        bail!("device must be `cpu` or `cuda:N`, got `{name}`");
    };
    if !candle_core::utils::cuda_is_available() {
        bail!("device {name}: this build has no CUDA support (build with --features cuda)");
    }
    Device::new_cuda(ordinal).map_err(|e| {
        // candle attaches a backtrace to the message; the first line is the error.
        let first = e.to_string().lines().next().unwrap_or_default().to_string();
        let hint = if first.contains("STUB_LIBRARY") {
            " (the CUDA driver here is the link-time stub: this machine has no GPU driver)"
        } else {
            ""
        };
        anyhow::anyhow!("device {name}: no usable CUDA device: {first}{hint}")
    })
}

/// Refuses the quantized dtypes off the CPU: candle's quantized CUDA
/// matmuls are not wired in (use f16 on CUDA).
pub(crate) fn check_quant(device: &Device, quant: Option<Quant>) -> Result<()> {
    match (device, quant) {
        (Device::Cpu, _) | (_, None) => Ok(()),
        (d, Some(q)) => bail!(
            "dtype {q} runs on the CPU only; on {d:?} use f16 (the quantized kernels are CPU kernels)"
        ),
    }
}

/// Refuses dtypes a device cannot compute in: CPU takes f32 and f16 (bf16
/// compute on CPU is slow and never used), CUDA f32, f16 and — from compute
/// capability 8.0 (Ampere, Orin, Hopper) — bf16.
pub fn check_dtype(device: &Device, dtype: DType) -> Result<()> {
    match (device, dtype) {
        (_, DType::F32 | DType::F16) => Ok(()),
        (Device::Cpu, other) => bail!(
            "dtype {} is not supported on CPU: use f32 or f16",
            other.as_str()
        ),
        (Device::Cuda(_), DType::BF16) => {
            let (major, minor) = compute_capability(device)?;
            if major < 8 {
                bail!("dtype bf16 needs a GPU of compute capability 8.0 or newer; this one is {major}.{minor}: use f16");
            }
            Ok(())
        }
        (_, other) => bail!("dtype {} is not supported on {device:?}", other.as_str()),
    }
}

/// (major, minor) compute capability of a CUDA device.
#[cfg(feature = "cuda")]
pub(crate) fn compute_capability(device: &Device) -> Result<(i32, i32)> {
    let ctx = device.as_cuda_device()?.cuda_stream().context().clone();
    Ok(ctx.compute_capability()?)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn compute_capability(_device: &Device) -> Result<(i32, i32)> {
    bail!("this build has no CUDA support (build with --features cuda)")
}

/// Device memory in use on the whole GPU (all processes), bytes; `None` on
/// CPU. Differences between two readings in one process are what this
/// process allocated.
#[cfg(feature = "cuda")]
pub(crate) fn memory_used_bytes(device: &Device) -> Option<u64> {
    let ctx = device
        .as_cuda_device()
        .ok()?
        .cuda_stream()
        .context()
        .clone();
    let (free, total) = ctx.mem_get_info().ok()?;
    Some((total - free) as u64)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn memory_used_bytes(_device: &Device) -> Option<u64> {
    None
}
