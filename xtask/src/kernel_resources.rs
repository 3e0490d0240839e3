//! `cargo xtask kernel-resources`: registers, LDS and scratch of every AMD kernel per target, read
//! from the code objects `cargo xtask kernels` wrote (their AMDGPU metadata notes, through
//! `llvm-readelf-19`), and the disassembly check that the decode kernels never touch scratch on
//! gfx942 and gfx1100 (`llvm-objdump-19`).
//!
//! `--markdown` prints the tables of docs/PERFORMANCE.md; `--check` (also part of every run, and
//! of `cargo xtask test`) fails on VGPR spills or scratch instructions in a decode kernel on the
//! checked targets, or on a code object whose wave size is not its target's (the kernels' RF_WARP
//! must match what the compiler used).

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::kernels::{out_dir, wave_size};
use crate::Result;

#[path = "../../kernels/code_objects.rs"]
mod code_objects;
use code_objects::{amd_code_objects, amdgpu_mach};

/// Targets whose decode kernels must not use scratch (CDNA3 and RDNA3).
pub const CHECKED: &[&str] = &["gfx942", "gfx1100"];
/// Modules whose kernels run in a decode step (mmq and dequant serve prefill and conversions).
const DECODE_MODULES: &[&str] = &["matvec", "attention", "ops", "stack"];
const READELF: &str = "llvm-readelf-19";
const OBJDUMP: &str = "llvm-objdump-19";

/// One kernel's resources in one code object.
#[derive(Default, Clone)]
pub struct Usage {
    vgpr: u32,
    agpr: u32,
    sgpr: u32,
    /// Static LDS bytes (`group_segment_fixed_size`).
    lds: u32,
    /// Scratch bytes per work-item (`private_segment_fixed_size`).
    scratch: u32,
    vgpr_spill: u32,
    sgpr_spill: u32,
    wave: u32,
    /// Scratch instructions in the disassembly (checked targets only).
    scratch_insts: Option<u32>,
}

/// `(module, target, kernel)` -> usage.
pub type Table = BTreeMap<(String, String, String), Usage>;

/// Whether the LLVM 19 tools are on PATH, else why not.
pub fn missing_tools() -> Option<String> {
    [READELF, OBJDUMP]
        .into_iter()
        .find(|t| {
            Command::new(t)
                .arg("--version")
                .output()
                .map(|o| !o.status.success())
                .unwrap_or(true)
        })
        .map(|t| format!("{t} not installed (`cargo xtask setup` installs llvm-19)"))
}

pub fn run(args: &[String]) -> Result<()> {
    let markdown = args.iter().any(|a| a == "--markdown");
    let check_only = args.iter().any(|a| a == "--check");
    if let Some(a) = args
        .iter()
        .find(|a| !matches!(a.as_str(), "--markdown" | "--check"))
    {
        return Err(format!(
            "unknown argument `{a}`; usage: cargo xtask kernel-resources [--markdown] [--check]"
        ));
    }
    let table = collect()?;
    if markdown {
        print!("{}", markdown_tables(&table));
    } else if !check_only {
        println!("target   module    kernel                                    vgpr agpr sgpr   lds scratch spill(v/s) wave scratch-insts");
        for ((m, t, k), u) in &table {
            println!(
                "{t:<8} {m:<9} {k:<41} {:>4} {:>4} {:>4} {:>5} {:>7} {:>5}/{:<4} {:>4} {}",
                u.vgpr,
                u.agpr,
                u.sgpr,
                u.lds,
                u.scratch,
                u.vgpr_spill,
                u.sgpr_spill,
                u.wave,
                u.scratch_insts.map_or("-".to_owned(), |n| n.to_string())
            );
        }
    }
    check(&table)
}

/// Fails on a wave size other than the target's, and on VGPR spills or scratch loads and stores
/// in a decode kernel on the [`CHECKED`] targets.
pub fn check(table: &Table) -> Result<()> {
    let mut errors = Vec::new();
    for ((m, t, k), u) in table {
        if u.wave != wave_size(t) {
            errors.push(format!(
                "{t} {m}::{k}: wave size {}, expected {}",
                u.wave,
                wave_size(t)
            ));
        }
        if CHECKED.contains(&t.as_str()) && DECODE_MODULES.contains(&m.as_str()) {
            // SGPR spills land in VGPR lanes, not memory; a frame no instruction touches
            // (`private_segment_fixed_size` alone) costs nothing. What costs is memory traffic.
            let insts = u.scratch_insts.unwrap_or(0);
            if u.vgpr_spill > 0 || insts > 0 {
                errors.push(format!(
                    "{t} {m}::{k}: {} VGPR spills, {insts} scratch instructions ({} bytes of scratch)",
                    u.vgpr_spill, u.scratch
                ));
            }
        }
    }
    for t in CHECKED {
        if !table.keys().any(|(_, tt, _)| tt == t) {
            println!("kernel-resources: no {t} code objects built: its spill check did not run");
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "kernel resource check failed:\n{}",
            errors.join("\n")
        ))
    }
}

/// Reads every AMD code object the manifest lists.
pub fn collect() -> Result<Table> {
    let out = out_dir();
    let manifest = out.join("manifest.txt");
    let text = fs::read_to_string(&manifest)
        .map_err(|e| format!("{}: {e} (run `cargo xtask kernels`)", manifest.display()))?;
    let tmp = env::temp_dir().join(format!("rocmforge-kernel-resources-{}", std::process::id()));
    fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut table = Table::new();
    let result = (|| {
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [module, "amd", archs, file] = f.as_slice() else {
                continue;
            };
            let path = out.join(file);
            let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let objects = amd_code_objects(&bytes).ok_or_else(|| {
                format!("{}: neither an offload bundle nor an ELF", path.display())
            })?;
            for (arch, elf) in objects {
                let arch = if arch.is_empty() {
                    (*archs).to_owned()
                } else {
                    arch
                };
                if amdgpu_mach(elf) != Some(arch.as_str()) {
                    return Err(format!(
                        "{}: the {arch} code object is for another processor",
                        path.display()
                    ));
                }
                let obj = tmp.join(format!("{module}.{arch}.o"));
                fs::write(&obj, elf).map_err(|e| format!("{}: {e}", obj.display()))?;
                let mut usage = notes(&obj)?;
                if CHECKED.contains(&arch.as_str()) {
                    for (k, n) in scratch_instructions(&obj)? {
                        if let Some(u) = usage.get_mut(&k) {
                            u.scratch_insts = Some(n);
                        }
                    }
                    for u in usage.values_mut() {
                        u.scratch_insts.get_or_insert(0);
                    }
                }
                for (k, u) in usage {
                    table.insert(((*module).to_owned(), arch.clone(), k), u);
                }
            }
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&tmp);
    result.map(|()| table)
}

fn tool_output(tool: &str, args: &[&str], obj: &Path) -> Result<String> {
    let o = Command::new(tool)
        .args(args)
        .arg(obj)
        .output()
        .map_err(|e| {
            format!("could not start {tool}: {e} (`cargo xtask setup` installs llvm-19)")
        })?;
    if !o.status.success() {
        return Err(format!(
            "{tool} {} {}: {}",
            args.join(" "),
            obj.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Each kernel's entry of the `amdhsa.kernels` metadata (YAML as llvm-readelf prints it: a kernel
/// starts at `  - `, its keys sit four spaces in).
fn notes(obj: &Path) -> Result<BTreeMap<String, Usage>> {
    let text = tool_output(READELF, &["--notes"], obj)?;
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, Usage)> = None;
    let mut in_kernels = false;
    for line in text.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if !in_kernels {
            continue;
        }
        if !line.starts_with(' ') {
            in_kernels = false;
        }
        let entry = line.strip_prefix("  - ");
        if entry.is_some() || !in_kernels {
            if let Some((name, u)) = cur.take() {
                out.insert(name, u);
            }
            if !in_kernels {
                continue;
            }
            cur = Some((String::new(), Usage::default()));
        }
        let Some(kv) = entry.or_else(|| line.strip_prefix("    ")) else {
            continue;
        };
        let Some((key, value)) = kv.split_once(':') else {
            continue;
        };
        let Some((name, u)) = cur.as_mut() else {
            continue;
        };
        let value = value.trim();
        let n = || value.parse::<u32>().unwrap_or(0);
        match key {
            ".name" => *name = value.to_owned(),
            ".vgpr_count" => u.vgpr = n(),
            ".agpr_count" => u.agpr = n(),
            ".sgpr_count" => u.sgpr = n(),
            ".group_segment_fixed_size" => u.lds = n(),
            ".private_segment_fixed_size" => u.scratch = n(),
            ".vgpr_spill_count" => u.vgpr_spill = n(),
            ".sgpr_spill_count" => u.sgpr_spill = n(),
            ".wavefront_size" => u.wave = n(),
            _ => {}
        }
    }
    if let Some((name, u)) = cur.take() {
        out.insert(name, u);
    }
    out.retain(|k, _| !k.is_empty());
    if out.is_empty() {
        return Err(format!("{}: no amdhsa.kernels metadata", obj.display()));
    }
    Ok(out)
}

/// Scratch loads and stores (`scratch_*`, and `buffer_*` through the private segment's
/// resource `s[0:3]` on targets without flat scratch) per function in the disassembly.
fn scratch_instructions(obj: &Path) -> Result<BTreeMap<String, u32>> {
    let text = tool_output(OBJDUMP, &["-d", "--no-show-raw-insn"], obj)?;
    let mut out = BTreeMap::new();
    let mut cur = String::new();
    for line in text.lines() {
        if let Some(name) = line
            .strip_suffix(">:")
            .and_then(|l| l.split_once('<'))
            .map(|(_, n)| n)
        {
            cur = name.to_owned();
            continue;
        }
        let inst = line.trim_start();
        if inst.starts_with("scratch_") || (inst.starts_with("buffer_") && inst.contains("s[0:3]"))
        {
            *out.entry(cur.clone()).or_insert(0) += 1;
        }
    }
    Ok(out)
}

/// docs/PERFORMANCE.md's tables: one line per target, then the decode kernels on the checked
/// targets.
fn markdown_tables(table: &Table) -> String {
    let mut s = String::new();
    s.push_str("| target | wave | kernels | max VGPR | max AGPR | max SGPR | max LDS (bytes) | kernels with scratch | spills |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let mut targets: Vec<&String> = table.keys().map(|(_, t, _)| t).collect();
    targets.sort_by_key(|t| {
        let v = t.trim_start_matches("gfx");
        (v.len(), v.to_owned())
    });
    targets.dedup();
    for t in &targets {
        let rows: Vec<&Usage> = table
            .iter()
            .filter(|((_, tt, _), _)| tt == *t)
            .map(|(_, u)| u)
            .collect();
        let max = |f: fn(&Usage) -> u32| rows.iter().map(|u| f(u)).max().unwrap_or(0);
        s.push_str(&format!(
            "| {t} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            max(|u| u.wave),
            rows.len(),
            max(|u| u.vgpr),
            max(|u| u.agpr),
            max(|u| u.sgpr),
            max(|u| u.lds),
            rows.iter().filter(|u| u.scratch > 0).count(),
            rows.iter()
                .map(|u| u.vgpr_spill + u.sgpr_spill)
                .sum::<u32>(),
        ));
    }
    s.push('\n');
    s.push_str("| module | kernel |");
    for t in CHECKED {
        s.push_str(&format!(" {t} VGPR/SGPR/LDS/scratch |"));
    }
    s.push_str("\n| --- | --- |");
    for _ in CHECKED {
        s.push_str(" --- |");
    }
    s.push('\n');
    let mut kernels: Vec<(&String, &String)> = table
        .keys()
        .filter(|(m, t, _)| DECODE_MODULES.contains(&m.as_str()) && CHECKED.contains(&t.as_str()))
        .map(|(m, _, k)| (m, k))
        .collect();
    kernels.sort();
    kernels.dedup();
    for (m, k) in kernels {
        s.push_str(&format!("| {m} | `{k}` |"));
        for t in CHECKED {
            match table.get(&((*m).clone(), (*t).to_owned(), (*k).clone())) {
                Some(u) => s.push_str(&format!(
                    " {}/{}/{}/{} |",
                    u.vgpr + u.agpr,
                    u.sgpr,
                    u.lds,
                    u.scratch
                )),
                None => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}
