//! `cargo xtask setup`: installs the Debian toolchains that GPU work needs (kernel compilers,
//! headers for bindgen), idempotently.

use std::fs;
use std::process::Command;

use crate::{run_cmd, Result};

/// Packages from Debian's `main` component.
const MAIN_PACKAGES: &[&str] = &[
    "hipcc",
    "libamdhip64-dev",
    "rocm-device-libs",
    "libclang-dev",
];
/// Packages from the `non-free` component.
const NON_FREE_PACKAGES: &[&str] = &["nvidia-cuda-toolkit", "nvidia-cuda-dev"];
const SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";
const NON_FREE_LIST: &str = "/etc/apt/sources.list.d/rocmforge-non-free.list";

pub fn run() -> Result<()> {
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

/// Adds `non-free` to the apt sources unless some source already carries it. Returns whether it
/// changed anything.
fn enable_non_free() -> Result<bool> {
    let mut text = String::new();
    for path in [SOURCES, "/etc/apt/sources.list"] {
        text.push_str(&fs::read_to_string(path).unwrap_or_default());
    }
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
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
    let line = format!("deb http://deb.debian.org/debian {codename} non-free non-free-firmware\n");
    fs::write(NON_FREE_LIST, line).map_err(|e| format!("{NON_FREE_LIST}: {e}"))?;
    Ok(true)
}
