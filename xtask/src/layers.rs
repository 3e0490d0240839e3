//! The checks that the library crates can be taken one layer at a time, as a downstream author
//! would: each packages and builds from its package alone, the downstream crates under
//! `tests/downstream/` build on one layer without pulling in a GPU crate or a higher layer, and
//! each crate builds with the Rust version it declares; once a version is tagged, the public API
//! is compared with it.

use std::collections::BTreeMap;
use std::env;
use std::path::PathBuf;
use std::process::Command;

use crate::{cargo, run_cmd, workspace_root, Result};

/// The library crates' directories, lowest layer first; [`package_name`] gives each one's
/// package.
pub const LIBRARIES: &[&str] = &[
    "gguf",
    "hip-ffi",
    "gpu-mem",
    "kernels",
    "ggml-graph",
    "model",
    "server",
];

/// Crates (directories) that a downstream build of the lower layers must not contain.
const GPU_AND_HIGHER: &[&str] = &["hip-ffi", "gpu-mem", "kernels", "model", "server"];

/// The package of the layer in directory `layer` (`gguf` -> `rocmforge-gguf`): the short names
/// belong to other projects on crates.io, so each package carries the project's name, and the
/// workspace renames it back to the layer's name for its own code.
pub fn package_name(layer: &str) -> String {
    format!("rocmforge-{layer}")
}

/// Downstream crates (directories under `tests/downstream/`) and what each one takes.
const DOWNSTREAM: &[(&str, &str)] = &[
    ("gguf-only", "gguf alone"),
    ("graph-cpu", "ggml-graph without features"),
];

/// Every check of this module, cheapest first.
pub fn run() -> Result<()> {
    readme_trees()?;
    downstream()?;
    msrv()?;
    package()?;
    semver()
}

fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Where the downstream crates and the packages build (dev profile, shared dependencies),
/// apart from the workspace's own builds: [`package`] cleans the library crates there.
fn layers_target_dir() -> PathBuf {
    target_dir().join("layers")
}

/// `cargo package` of every library crate, each verified by building the packaged sources
/// against its siblings' packages (cargo's local registry overlay for workspace packages).
pub fn package() -> Result<()> {
    forget_unpacked_packages()?;
    // Registry packages are assumed immutable, so cargo would also reuse what it compiled from
    // an earlier run's packages of the same version.
    let mut clean = cargo();
    clean
        .args(["clean", "--quiet", "--target-dir"])
        .arg(layers_target_dir());
    for lib in LIBRARIES {
        clean.args(["-p", &package_name(lib)]);
    }
    run_cmd(&mut clean)?;
    let mut cmd = cargo();
    cmd.args(["package", "--allow-dirty", "--target-dir"])
        .arg(layers_target_dir());
    for lib in LIBRARIES {
        cmd.args(["-p", &package_name(lib)]);
    }
    run_cmd(&mut cmd)
}

/// Removes the copies of the library packages that an earlier `cargo package` unpacked from its
/// local registry overlay. Cargo unpacks a registry package once per name and version (into
/// `$CARGO_HOME/registry/src/-HASH/`, the `-` of a registry without a host) and reuses that copy
/// even when the package changed since, as local registries are assumed immutable: without
/// this, a second run verifies against the first run's sources.
fn forget_unpacked_packages() -> Result<()> {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return Ok(());
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    for reg in registries.flatten() {
        if !reg.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(unpacked) = std::fs::read_dir(reg.path()) else {
            continue;
        };
        for dir in unpacked.flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            let ours = LIBRARIES.iter().any(|lib| {
                name.strip_prefix(package_name(lib).as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours {
                std::fs::remove_dir_all(dir.path())
                    .map_err(|e| format!("removing {}: {e}", dir.path().display()))?;
            }
        }
    }
    Ok(())
}

/// Fails where a library's README shows a dependency list (`cargo tree -e normal --depth 1 -p
/// CRATE`) other than the one cargo prints now.
pub fn readme_trees() -> Result<()> {
    let root = workspace_root();
    for lib in LIBRARIES {
        let readme_path = root.join(lib).join("README.md");
        let readme = std::fs::read_to_string(&readme_path)
            .map_err(|e| format!("{}: {e}", readme_path.display()))?;
        let package = package_name(lib);
        let cmd = format!("cargo tree -e normal --depth 1 -p {package}");
        let Some(shown) = readme
            .split_once(&format!("(`{cmd}"))
            .and_then(|(_, rest)| rest.split_once("```text\n"))
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(tree, _)| tree)
        else {
            return Err(format!("{lib}/README.md shows no `{cmd}` output"));
        };
        let out = cargo()
            .args(["tree", "-e", "normal", "--depth", "1", "-p", &package])
            .current_dir(&root)
            .output()
            .map_err(|e| format!("could not start cargo tree: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cmd} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Workspace crates print their path, which depends on the checkout.
        let actual: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| match l.find(" (/") {
                Some(i) => &l[..i],
                None => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        if actual.trim_end() != shown.trim_end() {
            return Err(format!(
                "{lib}/README.md shows other dependencies than `{cmd}` prints now; \
                 replace its list with:\n{actual}"
            ));
        }
    }
    println!("README dependency lists: as cargo tree prints them");
    Ok(())
}

/// Builds and runs each downstream crate and fails if its dependency tree holds a GPU crate or a
/// higher layer.
pub fn downstream() -> Result<()> {
    let root = workspace_root();
    for (dir, what) in DOWNSTREAM {
        let crate_dir = root.join("tests/downstream").join(dir);
        let manifest = crate_dir.join("Cargo.toml");
        // The workspace's lock file, so the downstream build uses the versions CI tested (cargo
        // drops what the crate does not use).
        std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock"))
            .map_err(|e| format!("copying Cargo.lock to {}: {e}", crate_dir.display()))?;
        // Outside the workspace, so `cargo fmt --all` does not reach it.
        run_cmd(
            cargo()
                .args(["fmt", "--check", "--manifest-path"])
                .arg(&manifest),
        )?;
        run_cmd(
            cargo()
                .args(["run", "--quiet", "--manifest-path"])
                .arg(&manifest)
                .arg("--target-dir")
                .arg(layers_target_dir()),
        )?;
        let out = cargo()
            .args([
                "tree",
                "-e",
                "normal",
                "--prefix",
                "none",
                "--manifest-path",
            ])
            .arg(&manifest)
            .current_dir(&root)
            .output()
            .map_err(|e| format!("could not start cargo tree: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo tree for tests/downstream/{dir} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let tree = String::from_utf8_lossy(&out.stdout);
        let pulled: Vec<String> = GPU_AND_HIGHER
            .iter()
            .map(|layer| package_name(layer))
            .filter(|name| {
                tree.lines()
                    .any(|l| l.split_whitespace().next() == Some(name.as_str()))
            })
            .collect();
        if !pulled.is_empty() {
            return Err(format!(
                "tests/downstream/{dir} takes {what} but its dependency tree holds {}",
                pulled.join(", ")
            ));
        }
        println!("downstream {dir}: {what}, no GPU crate or higher layer in its tree");
    }
    Ok(())
}

/// The library crates grouped by the `rust-version` each declares.
fn declared_msrvs() -> Result<BTreeMap<String, Vec<String>>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not start cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata output: {e}"))?;
    let mut by_version: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pkg in meta["packages"].as_array().into_iter().flatten() {
        let Some(name) = pkg["name"].as_str() else {
            continue;
        };
        if !LIBRARIES.iter().any(|lib| package_name(lib) == name) {
            continue;
        }
        let Some(v) = pkg["rust_version"].as_str() else {
            return Err(format!("{name} declares no rust-version"));
        };
        // `1.85` means 1.85.0, the toolchain to check with.
        let v = if v.matches('.').count() == 1 {
            format!("{v}.0")
        } else {
            v.to_owned()
        };
        by_version.entry(v).or_default().push(name.to_owned());
    }
    Ok(by_version)
}

fn installed_toolchains() -> Vec<String> {
    Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks each library crate (default features, plus `hip` where a crate has it) with the
/// toolchain of the Rust version it declares, where rustup has that toolchain; says what is
/// missing otherwise.
pub fn msrv() -> Result<()> {
    let installed = installed_toolchains();
    for (version, crates) in declared_msrvs()? {
        let host_suffix = format!("{version}-");
        if !installed
            .iter()
            .any(|t| t == &version || t.starts_with(&host_suffix))
        {
            println!(
                "msrv: skipped for {} (rust-version {version}): toolchain not installed \
                 (`rustup toolchain install {version} --profile minimal`)",
                crates.join(", ")
            );
            continue;
        }
        let mut cmd = Command::new("rustup");
        cmd.args(["run", &version, "cargo", "check", "--quiet", "--lib"])
            // A toolchain of its own would rebuild the shared dependencies in turn with every
            // compiler; its own directory keeps each one's artifacts for the next run.
            .arg("--target-dir")
            .arg(target_dir().join(format!("msrv-{version}")));
        for c in &crates {
            cmd.args(["-p", c]);
            if c == "rocmforge-ggml-graph" || c == "rocmforge-model" {
                cmd.args(["--features", &format!("{c}/hip")]);
            }
        }
        // `cargo xtask` runs under the current toolchain, whose choice must not leak in.
        cmd.env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC");
        run_cmd(&mut cmd)?;
        println!("msrv: {} build with Rust {version}", crates.join(", "));
    }
    Ok(())
}

/// The newest tag reachable from `HEAD`, if any.
fn last_tag() -> Option<String> {
    let out = Command::new("git")
        .args(["describe", "--tags", "--abbrev=0"])
        .current_dir(workspace_root())
        .output()
        .ok()?;
    let tag = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !tag.is_empty()).then_some(tag)
}

/// `cargo semver-checks` of every library crate against the last tag: a change that needs a
/// new major (0.x: minor) version fails. Says why it does nothing while there is no tag or the
/// tool is not installed (building it takes longer than the rest of this module on CI).
pub fn semver() -> Result<()> {
    let Some(tag) = last_tag() else {
        println!("semver: no tagged version yet: nothing to compare the public API with");
        return Ok(());
    };
    let installed = cargo()
        .args(["semver-checks", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        println!(
            "semver: skipped: cargo-semver-checks is not installed \
             (`cargo install cargo-semver-checks --locked`) to compare with {tag}"
        );
        return Ok(());
    }
    let mut cmd = cargo();
    cmd.args(["semver-checks", "--baseline-rev", &tag]);
    for lib in LIBRARIES {
        cmd.args(["-p", &package_name(lib)]);
    }
    run_cmd(&mut cmd)
}
