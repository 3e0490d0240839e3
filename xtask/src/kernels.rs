//! `cargo xtask kernels`: compiles `kernels/hip/*.hip` for AMD (hipcc, one offload bundle per
//! module) and NVIDIA (nvcc on the HIP headers: SASS per architecture plus PTX), and writes the
//! manifest the `kernels` crate's build script embeds.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use crate::{workspace_root, Result};

#[path = "../../kernels/source_hash.rs"]
mod source_hash;
use source_hash::source_hash;

/// AMD targets Debian's ROCm 5.2 hipcc knows: CDNA 1-3 (wave64) and RDNA 1-2 (wave32).
/// `ROCMFORGE_AMD_ARCHS` (comma-separated) replaces the list, e.g. with gfx1100 on a newer ROCm.
const AMD_ARCHS: &str = "gfx906,gfx908,gfx90a,gfx940,gfx1010,gfx1030";
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

/// One compiler invocation and the manifest line describing its output.
struct Job {
    cmd: Command,
    line: String,
}

pub fn build() -> Result<Built> {
    let hipcc = which("hipcc").ok_or("hipcc not installed: run `cargo xtask setup` (as root)")?;
    let nvcc = which("nvcc").ok_or("nvcc not installed: run `cargo xtask setup` (as root)")?;
    let root = workspace_root();
    let src_dir = root.join("kernels/hip");
    let out = out_dir();
    let amd_archs = env::var("ROCMFORGE_AMD_ARCHS").unwrap_or_else(|_| AMD_ARCHS.to_owned());
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

    let mut jobs = Vec::new();
    for m in &modules {
        let src = src_dir.join(format!("{m}.hip"));
        let file = format!("{m}.amd.hsaco");
        let mut cmd = Command::new(&hipcc);
        cmd.env("HIP_PLATFORM", "amd")
            .arg("--genco")
            .arg(format!("--offload-arch={amd_archs}"))
            .args(["-O3", "-I"])
            .arg(&src_dir)
            .arg(&src)
            .arg("-o")
            .arg(out.join(&file));
        jobs.push(Job {
            cmd,
            line: format!("{m} amd {amd_archs} {file}"),
        });
        for sm in NVIDIA_SMS {
            let file = format!("{m}.{sm}.cubin");
            let mut cmd = nvcc_cmd(&nvcc, &src_dir, &src);
            cmd.arg("-cubin")
                .arg(format!("-arch={sm}"))
                .arg("-o")
                .arg(out.join(&file));
            jobs.push(Job {
                cmd,
                line: format!("{m} {sm} {sm} {file}"),
            });
        }
        let file = format!("{m}.ptx");
        let mut cmd = nvcc_cmd(&nvcc, &src_dir, &src);
        cmd.arg("-ptx")
            .arg(format!("-arch={}", PTX_ARCH.replace("sm_", "compute_")))
            .arg("-o")
            .arg(out.join(&file));
        jobs.push(Job {
            cmd,
            line: format!("{m} ptx {PTX_ARCH} {file}"),
        });
    }

    let workers = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1);
    let lines = run_parallel(jobs, workers)?;
    // PTX is loaded as a C string: make sure it ends with NUL.
    for m in &modules {
        let p = out.join(format!("{m}.ptx"));
        let mut text = fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if text.last() != Some(&0) {
            text.push(0);
            fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let mut body = format!("stamp {}\n", source_hash(&src_dir));
    for l in &lines {
        body.push_str(l);
        body.push('\n');
    }
    fs::write(&manifest, body).map_err(|e| format!("{}: {e}", manifest.display()))?;
    Ok(Built {
        dir: out,
        images: lines.len(),
    })
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
fn run_parallel(jobs: Vec<Job>, workers: usize) -> Result<Vec<String>> {
    let n = jobs.len();
    let queue = job_queue(jobs);
    let mut results: Vec<Option<Result<String>>> = (0..n).map(|_| None).collect();
    thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let q = &queue;
                s.spawn(move || {
                    let mut done = Vec::new();
                    while let Some((i, mut job)) = q.lock().map(|mut g| g.pop()).unwrap_or(None) {
                        eprintln!("+ {}", describe(&job.cmd));
                        let r = match job.cmd.current_dir(workspace_root()).output() {
                            Ok(o) if o.status.success() => Ok(job.line),
                            Ok(o) => Err(format!(
                                "`{}` failed with {}:\n{}{}",
                                describe(&job.cmd),
                                o.status,
                                String::from_utf8_lossy(&o.stdout),
                                String::from_utf8_lossy(&o.stderr)
                            )),
                            Err(e) => Err(format!("could not start `{}`: {e}", describe(&job.cmd))),
                        };
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
        Ok(lines)
    } else {
        Err(errors.join("\n"))
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
