//! Which ISA back ends this CPU runs, detected once (as ggml-cpu's
//! feature checks): the ops choose their back end from these, and the
//! back ends state their own needs through them.

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

/// AVX2, FMA and F16C: the `x86` and `x86_quant` back ends.
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX512F/BW/VL/VNNI as well as [`avx2`]: the `x86_vnni*` back ends,
/// unless `SELECTINFER_KERNELS=avx2` or `avxvnni` asks for the AVX2
/// kernels (to compare them).
pub(crate) fn avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            avx2()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && std::env::var("SELECTINFER_KERNELS")
                    .map_or(true, |v| v != "avx2" && v != "avxvnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-VNNI (the 256-bit `vpdpbusd`, without AVX-512) as well as
/// [`avx2`]: the `x86_avxvnni_gemm` back end of the tiles, used where
/// [`avx512_vnni`] is not; `SELECTINFER_KERNELS=avx2` turns it off,
/// `SELECTINFER_KERNELS=avxvnni` turns AVX-512 off to run it (to compare).
pub(crate) fn avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            avx2()
                && is_x86_feature_detected!("avxvnni")
                && std::env::var("SELECTINFER_KERNELS").map_or(true, |v| v != "avx2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
