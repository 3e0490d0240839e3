//! Choosing the provider: a [`Choice`] given before first use (the CLI passes its
//! `ROCMFORGE_PLATFORM` here, with `ROCM_PATH` and `CUDA_PATH` as [`InstallDirs`]) forces one (or
//! the CPU); otherwise AMD then NVIDIA are tried and the first that reports a device wins. The
//! choice is made once per process.

use std::sync::{Mutex, OnceLock};

use crate::amd::AmdProvider;
use crate::api::{HipApi, Platform};
use crate::error::{Error, Result};
use crate::loader::InstallDirs;
use crate::nvidia::NvidiaProvider;

/// The name under which the CLI's environment carries the choice (error messages use it).
pub const PLATFORM_VAR: &str = "ROCMFORGE_PLATFORM";

/// Which platform to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Choice {
    /// Unset or empty: try AMD, then NVIDIA.
    #[default]
    Auto,
    /// Only this platform.
    Force(Platform),
    /// No GPU at all.
    Cpu,
}

/// Parses a `ROCMFORGE_PLATFORM` value (case-insensitive).
pub fn parse_choice(value: Option<&str>) -> Result<Choice> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(Choice::Auto),
        Some(v) if v.is_empty() || v == "auto" => Ok(Choice::Auto),
        Some(v) if v == "amd" || v == "rocm" || v == "hip" => Ok(Choice::Force(Platform::Amd)),
        Some(v) if v == "nvidia" || v == "cuda" => Ok(Choice::Force(Platform::Nvidia)),
        Some(v) if v == "cpu" => Ok(Choice::Cpu),
        Some(_) => Err(Error::BadPlatformVar(value.unwrap_or_default().to_owned())),
    }
}

/// How the process-wide provider is chosen and where its libraries are looked for
/// ([`set_options`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Which platform (the CLI's `ROCMFORGE_PLATFORM`).
    pub choice: Choice,
    /// The vendors' install prefixes, searched after the loader path (the CLI's `ROCM_PATH` and
    /// `CUDA_PATH`).
    pub dirs: InstallDirs,
}

/// Tries one provider: it must load, initialise and report at least one device.
pub fn try_provider(platform: Platform, dirs: &InstallDirs) -> Result<Box<dyn HipApi>> {
    let api: Box<dyn HipApi> = match platform {
        Platform::Amd => Box::new(AmdProvider::load(dirs)?),
        Platform::Nvidia => Box::new(NvidiaProvider::load(dirs)?),
    };
    let n = api.device_count()?;
    if n < 1 {
        return Err(Error::NoGpu(format!(
            "{} loaded but reports no device",
            api.library_names().join(", ")
        )));
    }
    Ok(api)
}

/// Selects a provider as `opts` say; the error says what each candidate platform found.
pub fn select(opts: &RuntimeOptions) -> Result<Box<dyn HipApi>> {
    let order: &[Platform] = match opts.choice {
        Choice::Cpu => {
            return Err(Error::NoGpu(format!("{PLATFORM_VAR}=cpu forces the CPU")));
        }
        Choice::Force(Platform::Amd) => &[Platform::Amd],
        Choice::Force(Platform::Nvidia) => &[Platform::Nvidia],
        Choice::Auto => &[Platform::Amd, Platform::Nvidia],
    };
    let mut why = Vec::new();
    for &p in order {
        match try_provider(p, &opts.dirs) {
            Ok(api) => {
                tracing::info!(platform = %p, libraries = ?api.library_names(), "GPU provider selected");
                return Ok(api);
            }
            Err(e) => {
                tracing::debug!(platform = %p, error = %e, "GPU provider unusable");
                why.push(format!("{p}: {e}"));
            }
        }
    }
    Err(Error::NoGpu(why.join("; ")))
}

static RUNTIME: OnceLock<Result<Box<dyn HipApi>>> = OnceLock::new();

/// The options [`runtime`] selects with ([`set_options`]; the defaults when never set).
static OPTIONS: Mutex<RuntimeOptions> = Mutex::new(RuntimeOptions {
    choice: Choice::Auto,
    dirs: InstallDirs {
        rocm: None,
        cuda: None,
    },
});

/// Sets how the process-wide provider is chosen. Only a call before its first use counts:
/// returns false when the provider was chosen already (with the earlier options).
pub fn set_options(opts: RuntimeOptions) -> bool {
    let mut o = OPTIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *o = opts;
    RUNTIME.get().is_none()
}

/// The process-wide provider, chosen on first use as [`set_options`] said and from what is
/// installed. Never panics; "no GPU" is an `Err` whose message lists what was tried.
pub fn runtime() -> Result<&'static dyn HipApi> {
    RUNTIME
        .get_or_init(|| {
            let opts = OPTIONS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            select(&opts)
        })
        .as_ref()
        .map(|b| b.as_ref())
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_variable_values() {
        assert_eq!(parse_choice(None).ok(), Some(Choice::Auto));
        assert_eq!(parse_choice(Some("")).ok(), Some(Choice::Auto));
        assert_eq!(
            parse_choice(Some("AMD")).ok(),
            Some(Choice::Force(Platform::Amd))
        );
        assert_eq!(
            parse_choice(Some(" nvidia ")).ok(),
            Some(Choice::Force(Platform::Nvidia))
        );
        assert_eq!(parse_choice(Some("cpu")).ok(), Some(Choice::Cpu));
        let e = parse_choice(Some("tpu")).expect_err("tpu is no platform");
        assert!(e.to_string().contains("\"tpu\""), "{e}");
    }

    #[test]
    fn forcing_cpu_gives_no_gpu_with_the_reason() {
        let opts = RuntimeOptions {
            choice: Choice::Cpu,
            ..Default::default()
        };
        let e = select(&opts).err().expect("cpu forced");
        assert!(matches!(e, Error::NoGpu(_)));
        assert!(e.to_string().contains("ROCMFORGE_PLATFORM=cpu"), "{e}");
    }

    /// On a machine without a GPU (CI), selection fails with a reason naming both platforms;
    /// with a GPU, it succeeds and reports devices. Either way it must not panic.
    #[test]
    fn auto_selection_never_panics_and_explains_itself() {
        match select(&RuntimeOptions::default()) {
            Ok(api) => {
                let n = api.device_count().expect("device count");
                assert!(n > 0);
                println!(
                    "selected {} with {n} device(s): {:?}",
                    api.platform(),
                    api.library_names()
                );
            }
            Err(Error::NoGpu(why)) => {
                assert!(why.contains("amd:") && why.contains("nvidia:"), "{why}");
                crate::testing::skip::<()>(format!("no GPU ({why})"));
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }
}
