//! `cargo xtask kernels`: compiles `kernels/hip/*.hip` for AMD and NVIDIA (nvcc on the HIP headers:
//! SASS per architecture plus PTX), and writes the manifest the `kernels` crate's build script
//! embeds.
//!
//! AMD targets go to the first toolchain whose device libraries carry them: Debian's hipcc (ROCm
//! 5.2; one offload bundle per module for all its targets) is the fallback that always builds the
//! older GPUs, and the newer toolchain `cargo xtask setup` installs ([`crate::amd_toolchain`])
//! builds one code object per module and target for today's GPUs. Targets neither can build are
//! skipped and named. Every compile is cached by its sources, command and compiler version
//! ([`cache_dir`]), so an unchanged tree compiles nothing.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use crate::{amd_toolchain, workspace_root, Result};

#[path = "../../kernels/source_hash.rs"]
mod source_hash;
use source_hash::source_hash;

/// AMD targets built by default: CDNA 1-3 and RDNA 1-2 (what Debian's ROCm 5.2 knows), then
/// MI300 (gfx942), MI350 (gfx950), RDNA3 (gfx1100-1102), Strix Halo (gfx1151) and RDNA4
/// (gfx1200/1201). `ROCMFORGE_AMD_ARCHS` (comma-separated) replaces the list.
pub const AMD_ARCHS: &str = "gfx906,gfx908,gfx90a,gfx940,gfx1010,gfx1030,\
                             gfx942,gfx950,gfx1100,gfx1101,gfx1102,gfx1151,gfx1200,gfx1201";
/// Where Debian's rocm-device-libs (ROCm 5.2, hipcc's) keep their bitcode.
const HIPCC_BITCODE: &str = "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode";
/// NVIDIA SASS targets (Ampere, Hopper); PTX is generated for the lowest so newer GPUs JIT it.
const NVIDIA_SMS: &[&str] = &["sm_80", "sm_90"];
const PTX_ARCH: &str = "sm_80";

/// What a run compiled, for the caller's summary.
pub struct Built {
    pub dir: PathBuf,
    pub images: usize,
}

/// The folder code objects go to (`$ROCMFORGE_KERNELS_DIR` or `kernels/out`).
pub fn out_dir() -> PathBuf {
    env::var_os("ROCMFORGE_KERNELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("kernels/out"))
}

/// The first kernel compiler missing from PATH, if any.
pub fn missing_toolchain() -> Option<&'static str> {
    ["hipcc", "nvcc"].into_iter().find(|t| which(t).is_none())
}

pub fn run() -> Result<()> {
    let built = build()?;
    println!(
        "kernels: {} code objects in {} (rebuild crates depending on `kernels` to embed them)",
        built.images,
        built.dir.display()
    );
    Ok(())
}

/// One compiler invocation, the file it writes and the manifest line describing it.
struct Job {
    cmd: Command,
    /// The file the command writes (in the output folder).
    out: PathBuf,
    /// The cache entry's name: the compile's inputs (sources, command, compiler version) hashed.
    key: String,
    line: String,
}

/// What a compile's cache key is made of besides its command and compiler.
struct KeyBase<'a> {
    /// The sources' hash.
    sources: &'a str,
    /// The checkout and the output folder, replaced by placeholders in the command so that a
    /// clone elsewhere (CI's) finds the same entries.
    root: String,
    out: String,
}

impl Job {
    fn new(cmd: Command, out: PathBuf, line: String, base: &KeyBase<'_>, compiler: &str) -> Job {
        let command = describe(&cmd)
            .replace(&base.out, "<out>")
            .replace(&base.root, "<root>");
        let key = fnv_hex(&[base.sources, compiler, &command]);
        Job {
            cmd,
            out,
            key,
            line,
        }
    }
}

/// How the AMD targets are split between the toolchains.
pub struct AmdPlan {
    /// Built by Debian's hipcc (ROCm 5.2) into one bundle per module.
    pub hipcc: Vec<String>,
    /// Built by the newer toolchain, one code object per target.
    pub modern: Vec<String>,
    /// Neither toolchain has device libraries for these.
    pub skipped: Vec<String>,
}

/// Assigns each wanted target to the first toolchain that supports it: hipcc 5.2 for the targets
/// it knows (its code objects are the ones tested longest), else the newer toolchain.
pub fn plan_amd(wanted: &str, hipcc: bool, modern: Option<&amd_toolchain::Toolchain>) -> AmdPlan {
    let mut plan = AmdPlan {
        hipcc: Vec::new(),
        modern: Vec::new(),
        skipped: Vec::new(),
    };
    for arch in wanted.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        if hipcc && amd_toolchain::isa_file(Path::new(HIPCC_BITCODE), arch).is_file() {
            plan.hipcc.push(arch.to_owned());
        } else if modern.is_some_and(|t| t.supports(arch)) {
            plan.modern.push(arch.to_owned());
        } else {
            plan.skipped.push(arch.to_owned());
        }
    }
    plan
}

/// The wavefront size the compiler uses for `arch` by default: 64 on GCN/CDNA (gfx9 and older),
/// 32 on RDNA (gfx10 and later).
pub fn wave_size(arch: &str) -> u32 {
    let major = arch
        .strip_prefix("gfx")
        .map(|v| &v[..v.len().saturating_sub(2)])
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(9);
    if major >= 10 {
        32
    } else {
        64
    }
}

pub fn build() -> Result<Built> {
    let hipcc = which("hipcc").ok_or("hipcc not installed: run `cargo xtask setup` (as root)")?;
    let nvcc = which("nvcc").ok_or("nvcc not installed: run `cargo xtask setup` (as root)")?;
    let modern = amd_toolchain::find();
    let root = workspace_root();
    let src_dir = root.join("kernels/hip");
    let out = out_dir();
    let wanted = env::var("ROCMFORGE_AMD_ARCHS").unwrap_or_else(|_| AMD_ARCHS.to_owned());
    let plan = plan_amd(&wanted, true, modern.as_ref());
    if !plan.skipped.is_empty() {
        println!(
            "kernels: skipped AMD targets {}: {}",
            plan.skipped.join(","),
            if modern.is_some() {
                "no installed toolchain has their device libraries"
            } else {
                "hipcc (ROCm 5.2) does not know them and the newer toolchain is not installed \
                 (`cargo xtask setup`)"
            }
        );
    }
    let mut modules: Vec<String> = fs::read_dir(&src_dir)
        .map_err(|e| format!("{}: {e}", src_dir.display()))?
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension().is_some_and(|x| x == "hip"))
                .then(|| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .flatten()
        })
        .collect();
    modules.sort();
    fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    // The manifest goes last, so an interrupted build leaves no manifest naming missing files.
    let manifest = out.join("manifest.txt");
    let _ = fs::remove_file(&manifest);
    let sources = source_hash(&src_dir);
    let base = KeyBase {
        sources: &sources,
        root: root.display().to_string(),
        out: out.display().to_string(),
    };
    let hipcc_id = tool_version(&hipcc);
    let nvcc_id = tool_version(&nvcc);
    // What the compiles read: hipBLAS's headers (for bindgen) do not count.
    let modern_id: String = modern
        .as_ref()
        .map(|t| {
            t.version
                .lines()
                .filter(|l| !l.starts_with("libhipblas"))
                .map(|l| format!("{l}\n"))
                .collect()
        })
        .unwrap_or_default();

    let mut jobs = Vec::new();
    for m in &modules {
        let src = src_dir.join(format!("{m}.hip"));
        if !plan.hipcc.is_empty() {
            let archs = plan.hipcc.join(",");
            let file = format!("{m}.amd.hsaco");
            let mut cmd = Command::new(&hipcc);
            cmd.env("HIP_PLATFORM", "amd")
                .arg("--genco")
                .arg(format!("--offload-arch={archs}"))
                .args(["-O3", "-I"])
                .arg(&src_dir)
                .arg(&src)
                .arg("-o")
                .arg(out.join(&file));
            let line = format!("{m} amd {archs} {file}");
            jobs.push(Job::new(cmd, out.join(&file), line, &base, &hipcc_id));
        }
        if let Some(t) = &modern {
            for arch in &plan.modern {
                let file = format!("{m}.{arch}.hsaco");
                let cmd = modern_cmd(t, arch, &src_dir, &src, &out.join(&file));
                let line = format!("{m} amd {arch} {file}");
                jobs.push(Job::new(cmd, out.join(&file), line, &base, &modern_id));
            }
        }
        for sm in NVIDIA_SMS {
            let file = format!("{m}.{sm}.cubin");
            let mut cmd = nvcc_cmd(&nvcc, &src_dir, &src);
            cmd.arg("-cubin")
                .arg(format!("-arch={sm}"))
                .arg("-o")
                .arg(out.join(&file));
            let line = format!("{m} {sm} {sm} {file}");
            jobs.push(Job::new(cmd, out.join(&file), line, &base, &nvcc_id));
        }
        let file = format!("{m}.ptx");
        let mut cmd = nvcc_cmd(&nvcc, &src_dir, &src);
        cmd.arg("-ptx")
            .arg(format!("-arch={}", PTX_ARCH.replace("sm_", "compute_")))
            .arg("-o")
            .arg(out.join(&file));
        let line = format!("{m} ptx {PTX_ARCH} {file}");
        jobs.push(Job::new(cmd, out.join(&file), line, &base, &nvcc_id));
    }

    let workers = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1);
    let cache = cache_dir();
    let (lines, compiled) = run_parallel(jobs, workers, &cache)?;
    // PTX is loaded as a C string: make sure it ends with NUL.
    for m in &modules {
        let p = out.join(format!("{m}.ptx"));
        let mut text = fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if text.last() != Some(&0) {
            text.push(0);
            fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let mut body = format!("stamp {sources}\n");
    for l in &lines {
        body.push_str(l);
        body.push('\n');
    }
    fs::write(&manifest, body).map_err(|e| format!("{}: {e}", manifest.display()))?;
    println!(
        "kernels: AMD {} (hipcc 5.2) + {} (clang {}); {compiled} of {} code objects compiled, \
         the rest from {}",
        if plan.hipcc.is_empty() {
            "-".to_owned()
        } else {
            plan.hipcc.join(",")
        },
        if plan.modern.is_empty() {
            "-".to_owned()
        } else {
            plan.modern.join(",")
        },
        amd_toolchain::LLVM_MAJOR,
        lines.len(),
        cache.display()
    );
    Ok(Built {
        dir: out,
        images: lines.len(),
    })
}

/// `zig clang` compiling one module for one target into a plain code object (no bundle).
fn modern_cmd(
    t: &amd_toolchain::Toolchain,
    arch: &str,
    src_dir: &Path,
    src: &Path,
    out: &Path,
) -> Command {
    let mut cmd = Command::new(&t.zig);
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![t.bin.clone()];
    dirs.extend(env::split_paths(&path));
    if let Ok(p) = env::join_paths(dirs) {
        cmd.env("PATH", p);
    }
    cmd.args(["clang", "-x", "hip"])
        .arg(format!("--offload-arch={arch}"))
        .args(["--cuda-device-only", "--no-gpu-bundle-output", "-O3"])
        .arg("-resource-dir")
        .arg(&t.resource)
        .arg(format!("--rocm-path={}", t.rocm.display()))
        // Before the system folders, which hold ROCm 5.2's HIP headers.
        .arg("-isystem")
        .arg(t.rocm.join("include"))
        .arg(format!("--rocm-device-lib-path={}", t.bitcode.display()))
        // The wave size as a per-target constant (common.h): clang 21 deprecates its macro.
        .arg(format!("-DRF_WAVE_SIZE={}", wave_size(arch)))
        .arg("-I")
        .arg(src_dir)
        .arg(src)
        .arg("-o")
        .arg(out);
    cmd
}

/// The first line of `tool --version`'s output (any stream), to key the cache on.
fn tool_version(tool: &Path) -> String {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s
        })
        .unwrap_or_default()
}

/// `$ROCMFORGE_KERNEL_CACHE`, else `rocmforge/kernel-cache` beside the model cache.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = env::var_os("ROCMFORGE_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    let models = crate::fetch_model::cache_dir();
    models
        .parent()
        .map(|p| p.join("kernel-cache"))
        .unwrap_or_else(|| models.join("kernel-cache"))
}

/// FNV-1a over the parts (each followed by a NUL), as 16 hex digits.
fn fnv_hex(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.as_bytes().iter().chain(&[0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn nvcc_cmd(nvcc: &Path, src_dir: &Path, src: &Path) -> Command {
    let mut cmd = Command::new(nvcc);
    // HIP 5.2's NVIDIA headers need CUDA 11 (Debian's 11.8); `-x cu` makes nvcc treat .hip as CUDA.
    cmd.args(["-O3", "-x", "cu", "-D__HIP_PLATFORM_NVIDIA__", "-I"])
        .arg(src_dir)
        .arg(src);
    cmd
}

/// Runs the jobs on `workers` threads; returns their manifest lines in job order, or every
/// failure's command and output.
fn run_parallel(jobs: Vec<Job>, workers: usize, cache: &Path) -> Result<(Vec<String>, usize)> {
    let n = jobs.len();
    let queue = job_queue(jobs);
    let mut results: Vec<Option<Result<String>>> = (0..n).map(|_| None).collect();
    let compiled = std::sync::atomic::AtomicUsize::new(0);
    thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let q = &queue;
                let compiled = &compiled;
                s.spawn(move || {
                    let mut done = Vec::new();
                    while let Some((i, job)) = q.lock().map(|mut g| g.pop()).unwrap_or(None) {
                        let r = run_job(job, cache, compiled);
                        done.push((i, r));
                    }
                    done
                })
            })
            .collect();
        for h in handles {
            if let Ok(done) = h.join() {
                for (i, r) in done {
                    results[i] = Some(r);
                }
            }
        }
    });
    let mut lines = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for r in results {
        match r {
            Some(Ok(l)) => lines.push(l),
            Some(Err(e)) => errors.push(e),
            None => errors.push("a compile worker panicked".to_owned()),
        }
    }
    if errors.is_empty() {
        Ok((lines, compiled.into_inner()))
    } else {
        Err(errors.join("\n"))
    }
}

/// Copies the job's output from the cache, or compiles it and stores it there (a cache that cannot
/// be written only costs the next run a compile).
fn run_job(
    mut job: Job,
    cache: &Path,
    compiled: &std::sync::atomic::AtomicUsize,
) -> Result<String> {
    let name = job
        .out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entry = cache.join(format!("{}-{name}", job.key));
    if fs::copy(&entry, &job.out).is_ok() {
        return Ok(job.line);
    }
    eprintln!("+ {}", describe(&job.cmd));
    match job.cmd.current_dir(workspace_root()).output() {
        Ok(o) if o.status.success() => {
            compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            store(cache, &name, &entry, &job.out);
            Ok(job.line)
        }
        Ok(o) => Err(format!(
            "`{}` failed with {}:\n{}{}",
            describe(&job.cmd),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("could not start `{}`: {e}", describe(&job.cmd))),
    }
}

/// Puts `file` into the cache as `entry`, dropping older entries of the same output name so the
/// cache holds one build.
fn store(cache: &Path, name: &str, entry: &Path, file: &Path) {
    if fs::create_dir_all(cache).is_err() {
        return;
    }
    let suffix = format!("-{name}");
    if let Ok(rd) = fs::read_dir(cache) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            // `<16 hex digits>-<name>`: the key's length tells `a-b.ptx` from `b.ptx`.
            if n.len() == 16 + suffix.len() && n.ends_with(&suffix) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    // Through a temporary name, so a concurrent reader never copies half a file.
    let tmp = entry.with_extension("partial");
    if fs::copy(file, &tmp).is_ok() {
        let _ = fs::rename(&tmp, entry);
    }
}

type Queue = std::sync::Mutex<Vec<(usize, Job)>>;

fn job_queue(jobs: Vec<Job>) -> Queue {
    // Popped from the end: reverse so the first jobs start first.
    std::sync::Mutex::new(jobs.into_iter().enumerate().rev().collect())
}

fn which(prog: &str) -> Option<PathBuf> {
    env::var_os("PATH").and_then(|paths| {
        env::split_paths(&paths)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    })
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
