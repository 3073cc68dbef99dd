//! Enums of a few named values (modes, dtypes, engines) as the command
//! line, the node's parameters and YAML write them: one parser with one
//! error message, and `Display`/`FromStr` for each through [`impl_named!`].

/// A small enum whose values have fixed names.
pub trait Named: Copy + 'static {
    /// What the value is, for messages (`mode`, `dtype` …).
    const WHAT: &'static str;
    /// Every value, in the order help texts list them.
    const ALL: &'static [Self];
    /// The value's name.
    fn name(self) -> &'static str;
}

/// The names of every value, comma-separated.
pub(crate) fn names<T: Named>() -> String {
    T::ALL
        .iter()
        .map(|v| v.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The value named `s` (case-insensitive, surrounding space ignored).
pub fn parse<T: Named>(s: &str) -> anyhow::Result<T> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| anyhow::anyhow!("{} must be one of {}; got `{s}`", T::WHAT, names::<T>()))
}

/// Gives an enum of unit variants its names: an inherent `name()`, the
/// [`Named`] impl, `Display` (the name) and `FromStr` ([`parse`]).
///
/// `impl_named!(Mode, "mode", { Dense => "dense", LoadOnly => "load-only" });`
macro_rules! impl_named {
    ($t:ty, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $t {
            /// The name as written on the command line, in parameters and in YAML.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }
        }
        impl $crate::sys::named::Named for $t {
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = &[$(Self::$variant),+];
            fn name(self) -> &'static str {
                <$t>::name(self)
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
        impl std::str::FromStr for $t {
            type Err = anyhow::Error;
            fn from_str(s: &str) -> anyhow::Result<Self> {
                $crate::sys::named::parse(s)
            }
        }
    };
}
pub(crate) use impl_named;
