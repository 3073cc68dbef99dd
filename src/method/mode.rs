//! The engine's modes: how each treats the FFN at load time and per prompt.

/// How the engine treats the FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every neuron loaded and computed.
    Dense,
    /// γ of the neurons loaded (base then secondary), all loaded ones computed.
    LoadOnly,
    /// γ loaded; δ static + ε dynamic (chosen at prefill) computed.
    Selectinfer,
    /// Full load, φ·N neurons chosen dynamically per prompt (no profiler).
    Coreinfer,
    /// A random γ subset loaded, then as selectinfer.
    RandomLoad,
    /// The disk-offloading baseline: every neuron computed, FFN weights read
    /// from disk (page cache dropped) at every forward pass, none kept.
    DiskOffload,
}

impl Mode {
    /// Whether the load plan comes from a ranking file (the profiler's).
    pub(crate) fn needs_ranking(self) -> bool {
        matches!(self, Self::LoadOnly | Self::Selectinfer)
    }

    /// Whether the mode chooses, per prompt, which loaded neurons decode
    /// computes (selective computation).
    pub(crate) fn selects(self) -> bool {
        matches!(self, Self::Selectinfer | Self::Coreinfer | Self::RandomLoad)
    }

    /// Whether the mode holds only a subset of the FFN (selective loading:
    /// from a ranking when [`Mode::needs_ranking`], else a random one).
    pub(crate) fn loads_subset(self) -> bool {
        matches!(self, Self::LoadOnly | Self::Selectinfer | Self::RandomLoad)
    }

    /// Whether the mode keeps no FFN weights in memory (disk offload).
    pub(crate) fn streams_ffn(self) -> bool {
        self == Self::DiskOffload
    }
}

crate::sys::named::impl_named!(Mode, "mode", {
    Dense => "dense",
    LoadOnly => "load-only",
    Selectinfer => "selectinfer",
    Coreinfer => "coreinfer",
    RandomLoad => "random-load",
    DiskOffload => "disk-offload",
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::named::Named;

    #[test]
    fn every_mode_parses_back_from_its_name_and_a_bad_name_lists_them() {
        for &m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>().unwrap(), m);
            assert_eq!(
                format!(" {} ", m.to_string().to_uppercase())
                    .parse::<Mode>()
                    .unwrap(),
                m
            );
        }
        let e = "sparse".parse::<Mode>().unwrap_err().to_string();
        assert!(e.contains("`sparse`"), "{e}");
        for &m in Mode::ALL {
            assert!(e.contains(m.name()), "{e}");
        }
    }
}
