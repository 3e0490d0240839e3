//! The code objects inside an AMD kernel image and the processor each was built for, shared by the
//! `kernels` crate's tests and `cargo xtask kernel-resources` (both include this file as a module).

/// The code objects of an AMD image: the entries of a clang offload bundle (`hipcc --genco`,
/// several targets) with their target names, or the one ELF (unnamed) a single-target build
/// writes; `None` when `bytes` is neither.
pub fn amd_code_objects(bytes: &[u8]) -> Option<Vec<(String, &[u8])>> {
    const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    let u64_at = |o: usize| -> Option<usize> {
        let b: [u8; 8] = bytes.get(o..o.checked_add(8)?)?.try_into().ok()?;
        usize::try_from(u64::from_le_bytes(b)).ok()
    };
    if !bytes.starts_with(MAGIC) {
        return if bytes.starts_with(b"\x7fELF") {
            Some(vec![(String::new(), bytes)])
        } else {
            None
        };
    }
    let n = u64_at(MAGIC.len())?;
    let mut at = MAGIC.len() + 8;
    let mut out = Vec::new();
    for _ in 0..n {
        let (off, size, tlen) = (u64_at(at)?, u64_at(at + 8)?, u64_at(at + 16)?);
        let triple = bytes.get(at + 24..(at + 24).checked_add(tlen)?)?;
        let triple = String::from_utf8_lossy(triple).into_owned();
        at += 24 + tlen;
        // `hipv4-amdgcn-amd-amdhsa--gfx90a` (or `...--gfx90a:xnack-`); the host entry is empty.
        if let Some(target) = triple
            .split("--")
            .nth(1)
            .filter(|_| triple.contains("amdgcn"))
        {
            let arch = target.split(':').next().unwrap_or(target).to_owned();
            out.push((arch, bytes.get(off..off.checked_add(size)?)?));
        }
    }
    Some(out)
}

/// The processor an AMDGPU ELF was compiled for (`EF_AMDGPU_MACH_*` in the low byte of
/// `e_flags`, LLVM's numbering).
pub fn amdgpu_mach(elf: &[u8]) -> Option<&'static str> {
    let flags = u32::from_le_bytes(elf.get(48..52)?.try_into().ok()?);
    Some(match flags & 0xff {
        0x2f => "gfx906",
        0x30 => "gfx908",
        0x3f => "gfx90a",
        0x40 => "gfx940",
        0x4c => "gfx942",
        0x4f => "gfx950",
        0x33 => "gfx1010",
        0x36 => "gfx1030",
        0x41 => "gfx1100",
        0x46 => "gfx1101",
        0x47 => "gfx1102",
        0x4a => "gfx1151",
        0x48 => "gfx1200",
        0x4e => "gfx1201",
        _ => return None,
    })
}
