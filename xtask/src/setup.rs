//! `cargo xtask setup`: installs the Debian toolchains that GPU work needs (kernel compilers,
//! headers for bindgen, LLVM 19's readelf/objdump for the code object checks), then the newer
//! AMDGPU toolchain for today's AMD targets ([`crate::amd_toolchain`]), idempotently.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{run_cmd, Result};

/// Packages from Debian's `main` component.
const MAIN_PACKAGES: &[&str] = &[
    "hipcc",
    "libamdhip64-dev",
    "rocm-device-libs",
    "libclang-dev",
    // llvm-readelf/llvm-objdump that know gfx942 and gfx1100 (`cargo xtask kernel-resources`).
    "llvm-19",
];
/// Packages from the `non-free` component (their driver dependencies, e.g. `nvidia-support`,
/// live in `contrib`, so both components are enabled).
const NON_FREE_PACKAGES: &[&str] = &["nvidia-cuda-toolkit", "nvidia-cuda-dev"];
const SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";
const NON_FREE_LIST: &str = "/etc/apt/sources.list.d/rocmforge-non-free.list";
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

pub fn run() -> Result<()> {
    debian_packages()?;
    crate::amd_toolchain::install()
}

fn debian_packages() -> Result<()> {
    let wanted: Vec<&str> = MAIN_PACKAGES
        .iter()
        .chain(NON_FREE_PACKAGES)
        .copied()
        .collect();
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        println!(
            "setup: all packages already installed: {}",
            wanted.join(" ")
        );
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "missing packages {}; run as root (or install them with apt-get)",
            missing.join(" ")
        ));
    }
    if missing.iter().any(|p| NON_FREE_PACKAGES.contains(p)) && enable_non_free()? {
        println!("setup: enabled Debian's non-free component ({NON_FREE_LIST})");
    }
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    println!("setup: installed {}", missing.join(" "));
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Adds `contrib` and `non-free` to the apt sources unless some source already carries it. Returns whether it
/// changed anything.
fn enable_non_free() -> Result<bool> {
    let mut text = String::new();
    for path in [SOURCES, "/etc/apt/sources.list"] {
        text.push_str(&fs::read_to_string(path).unwrap_or_default());
    }
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
            // Our own file is rewritten below, so an older version of it does not count.
            if entry.path() == Path::new(NON_FREE_LIST) {
                continue;
            }
            text.push_str(&fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    if text
        .lines()
        .any(|l| !l.trim_start().starts_with('#') && l.contains("non-free "))
    {
        return Ok(false);
    }
    let codename = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VERSION_CODENAME=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
        })
        .ok_or("cannot read VERSION_CODENAME from /etc/os-release")?;
    // apt refuses a source whose URI and suite another entry already names with a different
    // `Signed-By`, so reuse the keyring of Debian's own deb822 entry when it has one.
    let signed_by = if Path::new(DEBIAN_KEYRING).exists() {
        format!(" [signed-by={DEBIAN_KEYRING}]")
    } else {
        String::new()
    };
    let line =
        format!("deb{signed_by} http://deb.debian.org/debian {codename} contrib non-free non-free-firmware\n");
    fs::write(NON_FREE_LIST, line).map_err(|e| format!("{NON_FREE_LIST}: {e}"))?;
    Ok(true)
}
