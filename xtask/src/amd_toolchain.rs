//! The AMDGPU toolchain for today's AMD targets (gfx942, gfx950, RDNA3/3.5/4), installed into a
//! private folder by `cargo xtask setup` from registries this machine reaches.
//!
//! Debian bookworm's hipcc (ROCm 5.2, clang 15) stops at gfx1036/gfx940; bookworm's clang-19
//! lacks gfx950 and its device libraries. The parts, chosen so that none needs a newer glibc:
//! - clang 21.1 from the `ziglang` 0.16.0 wheel on PyPI (a static binary with every LLVM target;
//!   `zig clang` is clang's own driver, `zig ld.lld` is lld), run through a small `lld` script
//!   because clang's AMDGPU linker step calls `lld -flavor gnu`;
//! - from Debian sid (a private apt configuration, nothing added to the system's sources; the
//!   packages are unpacked with `dpkg -x`, never installed): `rocm-device-libs-21` (ROCm 7.0's
//!   bitcode device libraries, built by LLVM 21, so clang 21 reads them), `libclang-common-21-dev`
//!   (clang's resource headers with the HIP wrappers, which zig does not ship) and
//!   `libamdhip64-dev` (HIP 6.4's headers; 5.2's call fence functions these libraries dropped),
//!   and `libhipblas-dev`/`libhipblas-common-dev` (hipBLAS's headers, which hip-ffi's bindings
//!   are generated from).
//!
//! Everything lives in [`dir`]; `VERSION` there names what was installed, and the kernel cache
//! keys on it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{pypi, run_cmd, Result};

/// The zig release whose clang (21.1) matches the device libraries' LLVM (21).
const ZIG_VERSION: &str = "0.16.0";
const ZIG_WHEEL: &str =
    "ziglang-0.16.0-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl";
const ZIG_SHA256: &str = "9fcda73f62b851dd72a54b710ad40a209896db14cfb13649e62191243556342b";
/// Debian sid packages unpacked into the toolchain folder.
const DEBS: &[&str] = &[
    "rocm-device-libs-21",
    "libclang-common-21-dev",
    "libamdhip64-dev",
    // hipBLAS's headers, for `cargo xtask bindgen` (bookworm has none).
    "libhipblas-dev",
    "libhipblas-common-dev",
];
const SID_SOURCE: &str = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                          http://deb.debian.org/debian sid main\n";
/// LLVM major version of clang and of the device libraries.
pub const LLVM_MAJOR: &str = "21";

/// The installed toolchain's paths.
pub struct Toolchain {
    /// The `zig` binary (`zig clang ...`).
    pub zig: PathBuf,
    /// Folder with the `lld` script, put first on the compiler's PATH.
    pub bin: PathBuf,
    /// clang's resource folder (`include/__clang_hip_runtime_wrapper.h`).
    pub resource: PathBuf,
    /// The ROCm prefix holding `include/hip` and `share/hip`.
    pub rocm: PathBuf,
    /// The device libraries (`ocml.bc`, `oclc_isa_version_*.bc`).
    pub bitcode: PathBuf,
    /// What was installed (one `name version` per line): part of the kernel cache key.
    pub version: String,
}

impl Toolchain {
    /// Whether the device libraries carry `arch` (clang needs its `oclc_isa_version` file).
    pub fn supports(&self, arch: &str) -> bool {
        isa_file(&self.bitcode, arch).is_file()
    }
}

/// `$ROCMFORGE_AMD_TOOLCHAIN`, else `rocmforge/amd-toolchain` beside the model cache.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ROCMFORGE_AMD_TOOLCHAIN") {
        return PathBuf::from(d);
    }
    let models = crate::fetch_model::cache_dir();
    models
        .parent()
        .map(|p| p.join("amd-toolchain"))
        .unwrap_or_else(|| models.join("amd-toolchain"))
}

/// The device library file clang links for `arch` (`gfx90a` -> `oclc_isa_version_90a.bc`).
pub fn isa_file(bitcode: &Path, arch: &str) -> PathBuf {
    let v = arch.strip_prefix("gfx").unwrap_or(arch);
    bitcode.join(format!("oclc_isa_version_{v}.bc"))
}

/// The toolchain in [`dir`], when complete.
pub fn find() -> Option<Toolchain> {
    let d = dir();
    let root = d.join("root/usr");
    let t = Toolchain {
        zig: d.join("zig/zig"),
        bin: d.join("bin"),
        resource: root.join(format!("lib/llvm-{LLVM_MAJOR}/lib/clang/{LLVM_MAJOR}")),
        rocm: root.clone(),
        bitcode: root.join(format!(
            "lib/llvm-{LLVM_MAJOR}/lib/clang/{LLVM_MAJOR}/amdgcn/bitcode"
        )),
        version: fs::read_to_string(d.join("VERSION")).ok()?,
    };
    let complete = t.zig.is_file()
        && t.bin.join("lld").is_file()
        && t.resource
            .join("include/__clang_hip_runtime_wrapper.h")
            .is_file()
        && t.rocm.join("include/hip/hip_runtime.h").is_file()
        && t.rocm.join("include/hipblas/hipblas.h").is_file()
        && t.bitcode.join("ocml.bc").is_file();
    complete.then_some(t)
}

/// Installs the toolchain into [`dir`] unless it is there (idempotent; needs network to PyPI and
/// Debian, not root).
pub fn install() -> Result<()> {
    if let Some(t) = find() {
        println!(
            "setup: AMD toolchain present in {} ({})",
            dir().display(),
            t.version.trim().replace('\n', ", ")
        );
        return Ok(());
    }
    let d = dir();
    // A partial earlier attempt is redone from scratch.
    if d.exists() {
        fs::remove_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    let mut version = format!("ziglang {ZIG_VERSION}\n");
    install_zig(&d)?;
    for (name, v) in install_debs(&d)? {
        version.push_str(&format!("{name} {v}\n"));
    }
    let bin = d.join("bin");
    fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let script = format!(
        "#!/bin/sh\n# clang's AMDGPU link step runs `lld -flavor gnu ...`; zig spells it `zig ld.lld`.\n\
         if [ \"$1\" = \"-flavor\" ]; then shift 2; fi\nexec '{}' ld.lld \"$@\"\n",
        d.join("zig/zig").display()
    );
    write_executable(&bin.join("lld"), script.as_bytes())?;
    // Written last: `find` treats a folder without it as incomplete.
    fs::write(d.join("VERSION"), &version).map_err(|e| format!("{}: {e}", d.display()))?;
    find().ok_or_else(|| format!("{}: installed, but incomplete", d.display()))?;
    println!(
        "setup: AMD toolchain installed in {} ({})",
        d.display(),
        version.trim().replace('\n', ", ")
    );
    Ok(())
}

/// Downloads the pinned ziglang wheel and unpacks its `ziglang/` folder into `d/zig`.
fn install_zig(d: &Path) -> Result<()> {
    let (url, meta) = pypi::package_json("ziglang")?;
    let file_url = meta["releases"][ZIG_VERSION]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .find(|f| f["filename"] == ZIG_WHEEL)
                .and_then(|f| f["url"].as_str())
        })
        .ok_or_else(|| format!("{url}: {ZIG_WHEEL} not listed"))?;
    let file_url = pypi::resolve(&url, file_url);
    eprintln!("downloading {ZIG_WHEEL}");
    let wheel = pypi::download(&file_url)?;
    let digest = format!("{:x}", Sha256::digest(&wheel));
    if digest != ZIG_SHA256 {
        return Err(format!(
            "{ZIG_WHEEL}: sha256 {digest}, expected {ZIG_SHA256}"
        ));
    }
    let mut zip = zip::ZipArchive::new(io::Cursor::new(wheel))
        .map_err(|e| format!("{ZIG_WHEEL}: not a wheel: {e}"))?;
    let dest = d.join("zig");
    for i in 0..zip.len() {
        let mut member = zip
            .by_index(i)
            .map_err(|e| format!("{ZIG_WHEEL}: member {i}: {e}"))?;
        let Some(rel) = member
            .enclosed_name()
            .and_then(|p| p.strip_prefix("ziglang").ok().map(Path::to_path_buf))
        else {
            continue;
        };
        if member.is_dir() || rel.as_os_str().is_empty() {
            continue;
        }
        let path = dest.join(&rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut out = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        io::copy(&mut member, &mut out).map_err(|e| format!("{}: {e}", path.display()))?;
        if member.unix_mode().is_some_and(|m| m & 0o111 != 0) || rel == Path::new("zig") {
            set_executable(&path)?;
        }
    }
    Ok(())
}

/// Fetches [`DEBS`] from Debian sid through a private apt configuration and unpacks them into
/// `d/root`; returns each package's version.
fn install_debs(d: &Path) -> Result<Vec<(String, String)>> {
    let apt = d.join("apt");
    let lists = apt.join("lists");
    let cache = apt.join("cache");
    let debs = apt.join("debs");
    for p in [
        lists.join("partial"),
        cache.join("archives/partial"),
        debs.clone(),
    ] {
        fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let sources = apt.join("sources.list");
    fs::write(&sources, SID_SOURCE).map_err(|e| format!("{}: {e}", sources.display()))?;
    let opts = [
        format!("Dir::State::Lists={}", lists.display()),
        format!("Dir::Cache={}", cache.display()),
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/nonexistent".to_owned(),
        // Private lists and cache: the system's apt locks are not ours to take.
        "Debug::NoLocking=1".to_owned(),
        // `apt-get download` writes into the current folder, which the sandbox user cannot.
        "APT::Sandbox::User=root".to_owned(),
    ];
    let apt_get = || {
        let mut c = Command::new("apt-get");
        c.arg("-q");
        for o in &opts {
            c.arg("-o").arg(o);
        }
        c
    };
    run_cmd(apt_get().arg("update"))?;
    let mut cmd = apt_get();
    cmd.arg("download").args(DEBS).current_dir(&debs);
    eprintln!(
        "+ apt-get download {} (in {})",
        DEBS.join(" "),
        debs.display()
    );
    let status = cmd
        .status()
        .map_err(|e| format!("could not start apt-get: {e}"))?;
    if !status.success() {
        return Err(format!(
            "apt-get download {} failed with {status}",
            DEBS.join(" ")
        ));
    }
    let root = d.join("root");
    let mut versions = Vec::new();
    for name in DEBS {
        let deb = fs::read_dir(&debs)
            .map_err(|e| format!("{}: {e}", debs.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
            })
            .ok_or_else(|| format!("apt-get download left no {name} package"))?;
        run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
        let out = Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg("Version")
            .output()
            .map_err(|e| format!("dpkg-deb: {e}"))?;
        versions.push((
            (*name).to_owned(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        ));
    }
    Ok(versions)
}

fn write_executable(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    set_executable(path)
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
}
