//! Checks that hold with or without embedded code objects.

use super::*;

#[test]
fn every_kernel_symbol_is_in_its_sources() {
    for m in Module::ALL {
        let file = format!("{}.hip", m.stem());
        let src = hip_source(&file);
        for k in KernelId::ALL.iter().filter(|k| k.module() == *m) {
            // Entry points are written either directly or through a macro taking the suffix.
            assert!(
                own_definition(&src, k.name()).is_some() || macro_defines(&src, k.name()),
                "{} not defined in {file}",
                k.name()
            );
        }
    }
}

/// Entry points `RF_MATVEC_FAST(name, ...)` defines besides `name` (longest first, so that
/// `_ks_add` is not taken for `_add`).
const MATVEC_SUFFIXES: &[&str] = &["_ks_add", "_multi", "_add", "_ks"];

/// The short-row expert mat-vecs' entries: (name suffix, the macro defining them, the entry's
/// name in the macro).
const ID_SHORT: &[(&str, &str, &str)] = &[
    (
        "_id_add_short",
        "RF_MATVEC_ID_SHORT",
        "name##_id_add_short(",
    ),
    ("_id_short", "RF_MATVEC_ID_SHORT", "name##_id_short("),
];

/// True when a `RF_MATVEC_FAST(name, ...)`, `RF_MATVEC_GATED(base, ...)` (for `base_gated`),
/// `RF_MATVEC_ID(base, ...)` (for `base_id`), `RF_MATVEC_ID_GATED(base, ...)` (for
/// `base_id_gated`), `RF_MATVEC_ID_ADD(base, ...)` (for `base_id_add`), one of [`ID_SHORT`]'s
/// macros, `RF_MMQ(name, T)` or `RF_DEQUANT(suffix, T)` line defines `name`.
fn macro_defines(src: &str, name: &str) -> bool {
    let gated = |b: &str| src.contains(&format!("RF_MATVEC_GATED({b},"));
    if id_short_entry(src, name).is_some()
        || cols_entry(src, name).is_some()
        || src.contains(&format!("RF_MATVEC_FAST({name},"))
        || ["_16", "_32", "_64", "_128"].iter().any(|sfx| {
            name.strip_suffix(sfx).is_some_and(|b| {
                src.contains(&format!("RF_MMQ({b},")) || src.contains(&format!("RF_MMQ_ID({b},"))
            })
        })
        || name.strip_suffix("_gated").is_some_and(gated)
        || name
            .strip_suffix("_id_gated")
            .is_some_and(|b| src.contains(&format!("RF_MATVEC_ID_GATED({b},")))
        || name
            .strip_suffix("_id_add")
            .is_some_and(|b| src.contains(&format!("RF_MATVEC_ID_ADD({b},")))
        || name
            .strip_suffix("_id")
            .is_some_and(|b| src.contains(&format!("RF_MATVEC_ID({b},")))
    {
        return true;
    }
    for suffix in MATVEC_SUFFIXES {
        if let Some(base) = name.strip_suffix(suffix) {
            if src.contains(&format!("RF_MATVEC_FAST({base},")) {
                return true;
            }
        }
    }
    for prefix in ["dequant_f16_", "get_rows_"] {
        if let Some(suffix) = name.strip_prefix(prefix) {
            if src.contains(&format!("RF_DEQUANT({suffix},")) {
                return true;
            }
        }
    }
    false
}

#[test]
fn weight_types_map_to_kernels_of_the_right_module() {
    for t in WeightType::ALL {
        assert_eq!(t.matvec().module(), Module::Matvec);
        assert_eq!(t.dequant_f16().module(), Module::Dequant);
        assert_eq!(t.get_rows().module(), Module::Dequant);
        assert_eq!(t.matvec_id().module(), Module::Matvec);
        assert_eq!(t.matvec_id_gated().module(), Module::Matvec);
        assert_eq!(
            t.matvec_id_add().name(),
            format!("{}_add", t.matvec_id().name())
        );
        assert_eq!(
            t.matvec_id_gated().name(),
            format!("{}_gated", t.matvec_id().name())
        );
        for nt in [16, 32, 64, 128] {
            assert_eq!(t.mmq(nt).module(), Module::Mmq);
            assert!(t.mmq(nt).name().ends_with(&format!("_{nt}")));
        }
        // The grouped kernels: the same type and width (at most 64 pairs per tile).
        for nt in [16, 32, 64] {
            assert_eq!(
                t.mmq_id(nt).name(),
                t.mmq(nt).name().replacen("mmq_", "mmq_id_", 1)
            );
            assert_eq!(mmq_id_mxfp4(nt).name(), format!("mmq_id_mxfp4_{nt}"));
        }
        assert_eq!(WeightType::from_ggml_name(t.ggml_name()), Some(*t));
        assert!(t
            .matvec()
            .name()
            .ends_with(&t.ggml_name().to_ascii_lowercase()));
    }
}

/// Q4_K and Q6_K have column mat-vecs for 2 to `MATVEC_COLS_MAX` vectors, whose one grid row takes them all;
/// the other types and other counts keep the one-vector kernels.
#[test]
fn column_matvecs_take_their_vectors_in_one_grid_row() {
    for t in WeightType::ALL {
        let has = matches!(t, WeightType::Q4_K | WeightType::Q6_K);
        for m in 0..=MATVEC_COLS_MAX + 1 {
            let takes = has && (2..=MATVEC_COLS_MAX).contains(&m);
            assert_eq!(t.matvec_cols(m, false).is_some(), takes, "{t:?} m={m}");
            assert_eq!(t.matvec_cols(m, true).is_some(), takes, "{t:?} m={m}");
            assert_eq!(t.matvec_cols_gated(m).is_some(), takes, "{t:?} m={m}");
            let (Some(plain), Some(add), Some(gated)) = (
                t.matvec_cols(m, false),
                t.matvec_cols(m, true),
                t.matvec_cols_gated(m),
            ) else {
                continue;
            };
            let nc = matvec_cols_per_block(m);
            assert!(nc >= m, "m={m} takes {nc} per grid row");
            assert_eq!(
                plain.name(),
                format!("{}_c{nc}", t.matvec().name()),
                "m={m}"
            );
            assert_eq!(add.name(), format!("{}_add", plain.name()));
            assert_eq!(gated.name(), format!("{}_gated", plain.name()));
            assert_eq!(matvec_cols_grid(*t, 4096, m)[1], 1);
            assert_eq!(
                matvec_cols_grid(*t, 4097, m)[0] as usize,
                4097usize.div_ceil(t.matvec_cols_rows_per_block())
            );
        }
    }
}

#[test]
fn attn_params_layout_matches_the_c_struct() {
    // 8 ints (32 bytes), 8 strides (64 bytes), one float, explicit tail padding.
    assert_eq!(std::mem::size_of::<AttnParams>(), 104);
    assert_eq!(std::mem::offset_of!(AttnParams, q_tok_stride), 32);
    assert_eq!(std::mem::offset_of!(AttnParams, scale), 96);
}

#[test]
fn lookup_reports_missing_kernels_or_finds_every_symbol() {
    if !built() {
        let err = image(Module::Ops, &Device::Nvidia { major: 9, minor: 0 }).unwrap_err();
        assert!(
            err.to_string()
                .contains("kernels not built: run `cargo xtask kernels`"),
            "{err}"
        );
        println!("skipped symbol check: kernels not built (run `cargo xtask kernels`)");
        return;
    }
    let devices = [
        Device::Nvidia { major: 9, minor: 0 },
        Device::Nvidia { major: 8, minor: 6 },
        Device::Nvidia {
            major: 12,
            minor: 0,
        },
        Device::Amd("gfx90a:sramecc+:xnack-".into()),
        Device::Amd("gfx1030".into()),
    ];
    for dev in &devices {
        for m in Module::ALL {
            let img = image(*m, dev).unwrap_or_else(|e| panic!("{e}"));
            for k in KernelId::ALL.iter().filter(|k| k.module() == *m) {
                assert!(
                    contains(img.bytes, k.name().as_bytes()),
                    "{} missing from the {:?} image for {dev:?}",
                    k.name(),
                    img.kind
                );
            }
        }
    }
    // Hopper gets SASS, Blackwell the PTX.
    let h = image(Module::Ops, &Device::Nvidia { major: 9, minor: 0 })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.kind, ImageKind::Cubin);
    let b = image(
        Module::Ops,
        &Device::Nvidia {
            major: 12,
            minor: 0,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.kind, ImageKind::Ptx);
    // Only code compiled for 9.0 and later waits for its predecessors: Hopper's SASS does,
    // the PTX (built for 8.0) that Blackwell gets does not, nor does Ampere's SASS.
    assert!(h.waits_for_predecessors());
    assert!(!b.waits_for_predecessors());
    let a = image(Module::Ops, &Device::Nvidia { major: 8, minor: 6 })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!a.waits_for_predecessors());
    let e = image(Module::Ops, &Device::Nvidia { major: 7, minor: 5 }).unwrap_err();
    assert!(e.to_string().contains("sm_75"), "{e}");
    let e = image(Module::Ops, &Device::Amd("gfx9999".into())).unwrap_err();
    assert!(e.to_string().contains("gfx9999"), "{e}");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Where `src` defines kernel `name` itself (`RF_KERNEL void [attributes] name(`).
fn own_definition(src: &str, name: &str) -> Option<usize> {
    src.match_indices("RF_KERNEL void ").find_map(|(at, _)| {
        let head = &src[at..at + src[at..].find('(')?];
        head.split_whitespace()
            .last()
            .filter(|n| *n == name)
            .map(|_| at)
    })
}

/// For a short-row expert mat-vec that one of [`ID_SHORT`]'s macros defines: the macro and the
/// entry's name in it.
fn id_short_entry(src: &str, name: &str) -> Option<(&'static str, &'static str)> {
    ID_SHORT.iter().find_map(|&(sfx, mac, entry)| {
        let base = name.strip_suffix(sfx)?;
        src.contains(&format!("{mac}({base},"))
            .then_some((mac, entry))
    })
}

/// For a column mat-vec `base_cNC[_add|_gated]` that a `RF_MATVEC_COLS(base, NC, ...)` line
/// defines: the entry's name in the macro (`name##_c##NC[##_add|##_gated]`).
fn cols_entry(src: &str, name: &str) -> Option<String> {
    let (rest, sfx) = ["_add", "_gated"]
        .iter()
        .find_map(|s| name.strip_suffix(s).map(|r| (r, *s)))
        .unwrap_or((name, ""));
    let at = rest.rfind("_c")?;
    let (base, nc) = (&rest[..at], &rest[at + 2..]);
    (nc.parse::<u32>().is_ok() && src.contains(&format!("RF_MATVEC_COLS({base}, {nc},")))
        .then(|| format!("name##_c##NC{}(", sfx.replace('_', "##_")))
}

/// The C parameter list of kernel `name` in `src`: its own definition, or the one of the macro
/// that defines it (`RF_MATVEC_FAST`, `RF_MATVEC_GATED`, `RF_MATVEC_ID`, `RF_MATVEC_ID_GATED`,
/// `RF_MATVEC_ID_ADD`, `RF_MMQ`, `RF_DEQUANT`).
fn c_params(src: &str, name: &str) -> Option<String> {
    let list_after = |at: usize| -> Option<String> {
        let open = at + src[at..].find('(')?;
        let close = open + src[open..].find(')')?;
        Some(src[open + 1..close].replace('\\', " "))
    };
    if let Some(at) = own_definition(src, name) {
        return list_after(at);
    }
    if let Some((mac, entry)) = id_short_entry(src, name) {
        let def = src.find(&format!("#define {mac}("))?;
        return list_after(def + src[def..].find(entry)?);
    }
    if let Some(entry) = cols_entry(src, name) {
        let def = src.find("#define RF_MATVEC_COLS(")?;
        return list_after(def + src[def..].find(&format!(" {entry}"))?);
    }
    if src.contains(&format!("RF_MATVEC_FAST({name},")) {
        let def = src.find("#define RF_MATVEC_FAST(")?;
        return list_after(def + src[def..].find(" name(")?);
    }
    for sfx in ["_16", "_32", "_64", "_128"] {
        if let Some(base) = name.strip_suffix(sfx) {
            if src.contains(&format!("RF_MMQ({base},")) {
                let def = src.find("#define RF_MMQ_NT(")?;
                return list_after(def + src[def..].find(" name##_##NT(")?);
            }
            if src.contains(&format!("RF_MMQ_ID({base},")) {
                let def = src.find("#define RF_MMQ_ID_NT(")?;
                return list_after(def + src[def..].find(" name##_##NT(")?);
            }
        }
    }
    if let Some(base) = name.strip_suffix("_id_add") {
        if src.contains(&format!("RF_MATVEC_ID_ADD({base},")) {
            let def = src.find("#define RF_MATVEC_ID_ADD(")?;
            return list_after(def + src[def..].find("name##_id_add(")?);
        }
    }
    if let Some(base) = name.strip_suffix("_id_gated") {
        if src.contains(&format!("RF_MATVEC_ID_GATED({base},")) {
            let def = src.find("#define RF_MATVEC_ID_GATED(")?;
            return list_after(def + src[def..].find("name##_id_gated(")?);
        }
    }
    if let Some(base) = name.strip_suffix("_id") {
        if src.contains(&format!("RF_MATVEC_ID({base},")) {
            let def = src.find("#define RF_MATVEC_ID(")?;
            return list_after(def + src[def..].find("name##_id(")?);
        }
    }
    if let Some(base) = name.strip_suffix("_gated") {
        if src.contains(&format!("RF_MATVEC_GATED({base},")) {
            let def = src.find("#define RF_MATVEC_GATED(")?;
            return list_after(def + src[def..].find("name##_gated(")?);
        }
    }
    for suffix in MATVEC_SUFFIXES {
        if let Some(base) = name.strip_suffix(suffix) {
            if src.contains(&format!("RF_MATVEC_FAST({base},")) {
                let def = src.find("#define RF_MATVEC_FAST(")?;
                let entry = format!(" name##{suffix}(");
                return list_after(def + src[def..].find(&entry)?);
            }
        }
    }
    for prefix in ["dequant_f16_", "get_rows_"] {
        if let Some(suffix) = name.strip_prefix(prefix) {
            if src.contains(&format!("RF_DEQUANT({suffix},")) {
                let def = src.find("#define RF_DEQUANT(")?;
                return list_after(def + src[def..].find(&format!("{prefix}##suffix("))?);
            }
        }
    }
    None
}

fn param_of_c(decl: &str) -> Option<Param> {
    let d = decl.split_whitespace().collect::<Vec<_>>().join(" ");
    if d.contains('*') {
        Some(Param::Ptr)
    } else if d.starts_with("long long ") {
        Some(Param::I64)
    } else if d.starts_with("int ") {
        Some(Param::I32)
    } else if d.starts_with("float ") {
        Some(Param::F32)
    } else if d.starts_with("attn_params ") {
        Some(Param::Attn)
    } else if d.starts_with("ds_params ") {
        Some(Param::Stack)
    } else if d.starts_with("ar_params ") {
        Some(Param::Peer)
    } else {
        None
    }
}

#[test]
fn parameter_table_matches_the_sources() {
    for &k in KernelId::ALL {
        let src = hip_source(&format!("{}.hip", k.module().stem()));
        let list = c_params(&src, k.name()).unwrap_or_else(|| panic!("{}: no signature", k.name()));
        let parsed: Vec<Param> = list
            .split(',')
            .map(|d| {
                param_of_c(d).unwrap_or_else(|| panic!("{}: unknown parameter `{d}`", k.name()))
            })
            .collect();
        assert_eq!(parsed, k.params(), "{}: ({list})", k.name());
    }
}

#[test]
fn struct_parameters_have_their_rust_size() {
    assert_eq!(
        Param::Attn.struct_bytes(),
        Some(std::mem::size_of::<AttnParams>())
    );
    assert_eq!(Param::I64.struct_bytes(), None);
}

/// Host streams may launch any of these kernels before its predecessor ends (programmatic
/// dependent launch), which is only safe because each one waits for the grids before it first
/// thing: every entry point, written directly or through a macro, opens with `rf_entry();`.
#[test]
fn every_kernel_opens_by_waiting_for_its_predecessors() {
    let mut entries = 0;
    for m in Module::ALL {
        let file = format!("{}.hip", m.stem());
        let src = hip_source(&file);
        let mut rest = src.as_str();
        while let Some(at) = rest.find("RF_KERNEL ") {
            let def = &rest[at..];
            let head = &def[..def.find('\n').unwrap_or(def.len())];
            rest = &def[head.len()..];
            if head.starts_with("RF_KERNEL extern") {
                continue; // the macro's own definition
            }
            let open = def.find('{').expect("a kernel body");
            let body = skip_blank(&def[open + 1..]);
            // The multi mat-vec first picks its matrix (arithmetic on its parameters only).
            let body = match body.strip_prefix("const mv_pick p = mv_multi_pick(") {
                Some(rest) => skip_blank(&rest[rest.find(';').map_or(0, |i| i + 1)..]),
                None => body,
            };
            // The decode stack and the head request their first weights before they wait
            // (checked below).
            if head.contains(" decode_stack(")
                || head.contains(" decode_stack_split(")
                || head.contains(" decode_stack_portable(")
                || head.contains(" decode_stack_qkv(")
                || head.contains(" decode_stack_portable_qkv(")
                || head.contains(" head_q6_k(")
            {
                entries += 1;
                continue;
            }
            assert!(
                body.starts_with("rf_entry();")
                    || body.starts_with("mv_entry<")
                    || body.starts_with("attn_dec_entry<"),
                "{file}: `{head}` does not open with rf_entry(); or an entry that ends with it"
            );
            entries += 1;
        }
    }
    assert!(entries >= 40, "only {entries} kernel definitions found");
    // The mat-vec entry only prefetches weights before it waits, and the decode attention's
    // only computes its visible range and prefetches cache rows.
    let src = hip_source("matvec.hip");
    let mv_allowed = ["constexpr ", "if (mv_piped<", "if (w2) rf_prefetch_l2("];
    assert_entry_only_prefetches(&src, "mv_entry", &mv_allowed);
    let attn = hip_source("attention.hip");
    assert_entry_only_prefetches(&attn, "attn_dec_entry", &[]);
    // The pipeline (which mv_entry leaves alone) only requests weight steps before it waits.
    let at = src.find("void pipe_rows(").expect("pipe_rows defined");
    let open = at + src[at..].find('{').expect("pipe_rows opens");
    let wait = open + src[open..].find("rf_entry();").expect("pipe_rows waits");
    let before: Vec<&str> = src[open..wait].lines().skip(1).map(str::trim).collect();
    assert!(
        before.iter().all(|l| l.starts_with("using ")
            || l.starts_with("const int nblk")
            || l.starts_with("#pragma unroll")
            || l.starts_with("for (int k = 0; k < D::S - 1; ++k) pipe_issue<")
            || l.starts_with("if (!entered)")
            || l.is_empty()),
        "pipe_rows does more than request weights before waiting: {before:?}"
    );
    assert!(
        before.len() >= 3,
        "pipe_rows' opening not found: {before:?}"
    );
    // The decode stack and the head only declare their shared memory, list their work items
    // and request weights.
    const STACK_PRELUDE: &[&str] = &[
        "#if defined(RF_CP_ASYNC)",
        "(void)out_stride;",
        "for (int i = threadIdx.x; i < ni; i += DS_THREADS) {",
        "ds_item t;",
        "t.",
        "items[i] = t;",
        "extern __shared__",
        "uint8_t* ",
        "__shared__ float ",
        "__shared__ float2 ",
        "const int ",
        "ds_item* ",
        "const ds_item* end = ",
        "ds_cursor ",
        "is.first(",
        "cu = is;",
        "const uint32_t ring_lane = ",
        "for (int s = 0; s < DS_STAGES - 1; ++s) ds_issue(",
        "constexpr int ",
        "int lane = ",
        "uint32_t st_use",
        "#if defined(RF_CP_ASYNC)",
        "#endif",
        "if constexpr (RING)",
        "ds_raw cur;",
        "if constexpr (!RING) ds_load(",
        "// ",
    ];
    let src = hip_source("stack.hip");
    // The stack kernels are ds_step (decode_stack: ds_step<true, false>, decode_stack_split
    // ds_step<true, true>, the portable one ds_step<false, false>).
    for name in ["ds_step", "head_q6_k"] {
        let at = src.find(&format!(" {name}(")).expect("kernel defined");
        let open = at + src[at..].find('{').expect("kernel opens");
        let wait = open + src[open..].find("rf_entry();").expect("kernel waits");
        let before: Vec<&str> = src[open..wait].lines().skip(1).map(str::trim).collect();
        assert!(
            before
                .iter()
                .all(|l| STACK_PRELUDE.iter().any(|p| l.starts_with(p))
                    || *l == "__syncthreads();"
                    || *l == "}"
                    || l.is_empty()),
            "{name} does more than request weights before waiting: {before:?}"
        );
    }
}

/// The body of the device function `name` in `src` holds only declarations, loops, L2 prefetches
/// and lines starting with one of `extra`, and ends with `rf_entry();`.
fn assert_entry_only_prefetches(src: &str, name: &str, extra: &[&str]) {
    let at = src
        .find(&format!("void {name}("))
        .unwrap_or_else(|| panic!("{name} not defined"));
    let end = at + src[at..].find("\n}").expect("a function body");
    let open = at + src[at..].find('{').expect("a function body");
    let body: Vec<&str> = src[open..end].lines().skip(1).map(str::trim).collect();
    assert!(
        body.iter().all(|l| l.starts_with("const ")
            || l.starts_with("for (")
            || l.starts_with("rf_prefetch_l2(")
            || extra.iter().any(|e| l.starts_with(e))
            || *l == "}"
            || *l == "rf_entry();"),
        "{name} does more than prefetch before waiting: {body:?}"
    );
    assert_eq!(body.last(), Some(&"rf_entry();"), "{name} ends by waiting");
}

fn skip_blank(s: &str) -> &str {
    s.trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
}

/// The text of the kernel source `file` (a path under `hip/`).
fn hip_source(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("hip")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value of `#define NAME value` in the kernel source `file`.
fn source_define(file: &str, name: &str) -> usize {
    let src = hip_source(file);
    let line = src
        .lines()
        .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("{file} defines no {name}"));
    line.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{file}: {name} {line}: {e}"))
}

#[test]
fn peer_all_reduce_mirrors_the_source() {
    let f = "allreduce.hip";
    assert_eq!(source_define(f, "AR_MAX_RANKS"), PEER_MAX_RANKS);
    assert_eq!(source_define(f, "AR_BLOCKS"), PEER_BLOCKS as usize);
    assert_eq!(source_define(f, "AR_THREADS"), PEER_THREADS as usize);
    assert_eq!(source_define(f, "AR_MIN_FLOATS"), PEER_MIN_FLOATS);
    assert_eq!(PEER_SYNC_WORDS, PEER_BLOCKS as usize * (PEER_MAX_RANKS + 1));
    // 16 addresses, the error word's address, a 64-bit timeout, four ints: no padding.
    assert_eq!(
        std::mem::size_of::<PeerReduceParams>(),
        16 * 8 + 8 + 8 + 4 * 4
    );
    assert_eq!(std::mem::offset_of!(PeerReduceParams, error), 128);
    assert_eq!(std::mem::offset_of!(PeerReduceParams, rank), 144);
    assert_eq!(Param::Peer.struct_bytes(), Some(160));
}

#[test]
fn decode_stack_mirrors_the_source() {
    let f = "stack/params.h";
    assert_eq!(source_define(f, "DS_THREADS"), STACK_THREADS as usize);
    assert_eq!(source_define(f, "DS_MAX_LAYERS"), STACK_MAX_LAYERS);
    assert_eq!(source_define(f, "DS_HEAD"), STACK_HEAD_DIM);
    assert_eq!(source_define(f, "DS_STAGES"), STACK_STAGES);
    assert_eq!(source_define(f, "DS_SLOT"), STACK_SLOT);
    // 14 pointers per layer (11 in the layer, 3 after the other fields), 11 more pointers, a
    // 64-bit stride, 22 32-bit fields: no padding, and under the 4 KB parameter limit.
    let size = std::mem::size_of::<StackParams>();
    assert_eq!(size, STACK_MAX_LAYERS * 112 + 11 * 8 + 8 + 22 * 4);
    assert!(size <= 4096);
    let a = "stack/attention.h";
    assert_eq!(source_define(a, "DS_ATTN_MAX_GRP"), STACK_MAX_GQA);
    assert_eq!(source_define(a, "DS_ATTN_MAX_KV"), STACK_MAX_KV_HEADS);
    // The split attention's floats (queries, then the outputs; a tile of scores) fit its area.
    assert_eq!(source_define(a, "DS_ATTN_TILE"), STACK_ATTN_TILE);
    assert_eq!(
        source_define(a, "DS_ATTN_MAX_COMBINE"),
        STACK_ATTN_MAX_COMBINE
    );
    let attn = STACK_MAX_GQA * STACK_HEAD_DIM + STACK_MAX_GQA * STACK_ATTN_TILE;
    assert!(attn * 4 <= STACK_ATTN_BYTES);
    // The 8B over 132 blocks: 16 shares of each of 8 KV heads, 266 KB of partial outputs.
    assert_eq!(stack_attn_splits(132, 32, 8), 16);
    assert_eq!(stack_attn_part_bytes(16, 32), 16 * 32 * 130 * 4);
    // The 70B shape's 64 query heads: 16 shares too (532 KB); MHA over 32 KV heads: 4.
    assert_eq!(stack_attn_splits(132, 64, 8), 16);
    assert_eq!(stack_attn_splits(132, 32, 32), 4);
    // One KV head (MQA) under eight query heads: the combination's 1024 weights bound it.
    assert_eq!(stack_attn_splits(132, 8, 1), 128);
    assert_eq!(stack_attn_splits(264, 8, 1), 128);
    // Their keys and values asked into L2 ahead: 480 rows a share on the 8B and 50 MiB (31.5
    // MB in all), none without a known L2.
    assert_eq!(stack_attn_prefetch_rows(50 << 20, 16, 8), 480);
    assert_eq!(stack_attn_prefetch_rows(0, 16, 8), 0);
    // The 8B's widest Q8 input already covers the split attention's area.
    assert_eq!(stack_split_shared_bytes(14336), stack_shared_bytes(14336));
    assert_eq!(
        stack_split_shared_bytes(2048),
        5 * 16 * 2304 + 512 * 32 + STACK_ATTN_BYTES
    );
    assert_eq!(source_define(f, "DS_MAX_ITEMS"), STACK_MAX_ITEMS);
    assert_eq!(source_define(f, "DS_QKV_BIAS"), STACK_QKV_BIAS as usize);
    assert_eq!(source_define(f, "DS_QKV_NEOX"), STACK_QKV_NEOX as usize);
    assert_eq!(source_define(f, "DS_QKV_NORM"), STACK_QKV_NORM as usize);
    assert_eq!(source_define(f, "DS_NORM_AT"), STACK_NORM_AT);
    // The 8B shapes: a 14336-wide Q8 input (16-value scales) and the work list beside the ring,
    // within an H100's 227 KB.
    assert_eq!(stack_shared_bytes(14336), 5 * 16 * 2304 + 512 * 32 + 17920);
    assert!(stack_shared_bytes(14336) <= 227 * 1024);
    // 32 layers of the 8B over 132 blocks: 2 q/k/v groups, 1 output, 4 gate/up and 1 down
    // group per layer for block 0.
    assert_eq!(stack_items(132, 32, 4096, 14336, 32, 8), 32 * 8);
    assert_eq!(
        stack_items(108, 32, 4096, 14336, 32, 8),
        32 * (2 + 2 + 5 + 2)
    );
    assert!(stack_items(16, 32, 4096, 14336, 32, 8) > STACK_MAX_ITEMS);
}

#[test]
fn decode_stack_prefetch_stays_within_the_l2() {
    // The 8B (4096 wide, 32 heads) over 132 blocks: two items with an H100's or H200's 50 MiB,
    // none with a 6 MiB L2 (an RTX 3090's, 82 blocks), one with 24 MiB.
    assert_eq!(stack_prefetch_items(50 << 20, 132, 32, 4096), 2);
    assert_eq!(stack_prefetch_items(40 << 20, 108, 32, 4096), 2);
    assert_eq!(stack_prefetch_items(24 << 20, 132, 32, 4096), 1);
    assert_eq!(stack_prefetch_items(6 << 20, 82, 32, 4096), 0);
    // Twice as wide: twice the bytes per item.
    assert_eq!(stack_prefetch_items(50 << 20, 132, 64, 8192), 1);
    // No headless blocks, no prefetch.
    assert_eq!(stack_prefetch_items(50 << 20, 32, 32, 4096), 0);
    assert_eq!(stack_prefetch_items(50 << 20, 16, 32, 4096), 0);
    assert!(stack_prefetch_items(1 << 30, 132, 32, 4096) <= 2);
}

#[test]
fn decode_attention_constants_mirror_the_source() {
    let f = "attention.hip";
    assert_eq!(
        source_define(f, "ATTN_DEC_THREADS"),
        ATTN_DEC_THREADS as usize
    );
    assert_eq!(source_define(f, "ATTN_DEC_MAX_KV"), ATTN_DEC_MAX_KV);
    assert_eq!(source_define(f, "ATTN_DMAX"), ATTN_MAX_HEAD_DIM);
    assert_eq!(source_define(f, "PD_THREADS"), PAGED_DEC_THREADS as usize);
}

#[test]
fn short_expert_matvec_constants_mirror_the_source() {
    let f = "matvec.hip";
    assert_eq!(source_define(f, "MV_SHORT_ROWS"), MATVEC_ID_SHORT_ROWS);
    assert_eq!(source_define(f, "MV_SHORT_BYTES"), MATVEC_ID_SHORT_STAGE);
    assert_eq!(
        source_define(f, "MV_SHORT_MAX_COLS"),
        MATVEC_ID_SHORT_MAX_COLS
    );
    assert_eq!(source_define(f, "MV_WARPS"), MATVEC_WARPS as usize);
    // Qwen3-30B-A3B's down rows (768 values) fit in Q4_K and Q6_K.
    assert!(matvec_id_short_fits(
        768,
        768 / 256 * WeightType::Q6_K.block_bytes()
    ));
    // Every type's longest row that fits the stage is within the quantized vector's room.
    for t in WeightType::ALL {
        let k = MATVEC_ID_SHORT_ROW_BYTES / t.block_bytes() * t.block_values();
        assert!(k <= MATVEC_ID_SHORT_MAX_COLS, "{t:?}: {k}");
    }
    assert_eq!(matvec_id_short_grid(2048), 64);
    assert_eq!(matvec_id_short_grid(45), 2);
    for t in WeightType::ALL {
        let short = t.matvec_id_short();
        assert_eq!(short.is_some(), t.block_values() == 256, "{t:?}");
        for k in short.into_iter().flatten() {
            assert_eq!(k.module(), Module::Matvec);
        }
    }
}

#[test]
fn mmq_constants_mirror_the_source() {
    assert_eq!(
        source_define("mmq.hip", "MMQ_THREADS"),
        MMQ_THREADS as usize
    );
    assert_eq!(source_define("mmq.hip", "MMQ_ROWS"), MMQ_ROWS);
    assert_eq!(source_define("mmq.hip", "MMQ_KT"), MMQ_STEP);
    for (nt, blocks) in MMQ_BLOCKS_PER_SM {
        assert_eq!(
            source_define("mmq.hip", &format!("MMQ_MIN_BLOCKS_{nt}")),
            blocks
        );
    }
    for (nt, bytes) in MMQ_SMEM_BYTES {
        assert_eq!(
            source_define("mmq.hip", &format!("MMQ_SMEM_{nt}")),
            bytes as usize
        );
    }
    // The resident blocks' budgets fit an H100's or H200's 228 KiB per multiprocessor (1 KiB
    // reserved per block).
    for (nt, bytes) in MMQ_SMEM_BYTES {
        let blocks = MMQ_BLOCKS_PER_SM
            .iter()
            .find(|b| b.0 == nt)
            .map_or(1, |b| b.1);
        assert!(
            blocks * (bytes as usize + 1024) <= 228 * 1024,
            "{nt}: {bytes}"
        );
    }
}

#[test]
fn mmq_plans_split_only_small_grids() {
    // 8B q/o projection, 32 vectors, 132 multiprocessors (4 blocks each): 64 tiles split to
    // fill the device (up to MMQ_MAX_SPLITS).
    let p = MmqPlan::new(4096, 32, 4096, 1, 132);
    assert_eq!((p.nt, p.splits, p.grid), (32, 8, [1, 64, 8]));
    assert!(p.partial);
    assert_eq!(p.partial_values(4096, 32), 8 * 32 * 4096);
    // 64 vectors, 2 blocks each: 64 tiles, 4 shares (5 would need a second wave).
    let p = MmqPlan::new(4096, 64, 4096, 1, 132);
    assert_eq!((p.nt, p.splits, p.grid), (64, 4, [1, 64, 4]));
    // The 8B FFN up projection, 8 vectors: 224 tiles, 2 shares (448 of 528 resident blocks).
    let p = MmqPlan::new(14336, 8, 4096, 1, 132);
    assert_eq!((p.nt, p.splits, p.grid), (16, 2, [1, 224, 2]));
    // More tiles than half the resident blocks: one share.
    assert_eq!(MmqPlan::new(14336, 8, 4096, 2, 132).splits, 1);
    // At most MMQ_MAX_SPLITS shares.
    assert_eq!(MmqPlan::new(4096, 16, 4096, 1, 132).splits, MMQ_MAX_SPLITS);
    // Enough tiles: one share, written directly.
    let p = MmqPlan::new(14336, 256, 4096, 1, 132);
    assert_eq!((p.nt, p.splits, p.grid), (128, 1, [2, 224, 1]));
    assert!(!p.partial);
    assert_eq!(p.partial_values(14336, 256), 0);
    // Gated (two matrices) always combines; short rows cap the split (two steps per share).
    let p = MmqPlan::new(100, 9, 512, 2, 132);
    assert_eq!((p.nt, p.splits, p.grid), (16, 1, [1, 2, 2]));
    assert!(p.partial);
    // Dynamic shared memory on NVIDIA only.
    let nv = Device::Nvidia { major: 9, minor: 0 };
    assert_eq!(MmqPlan::new(4096, 8, 4096, 1, 132).smem_bytes(&nv), 57344);
    assert_eq!(MmqPlan::new(4096, 64, 4096, 1, 132).smem_bytes(&nv), 98304);
    assert_eq!(MmqPlan::new(4096, 65, 4096, 1, 132).nt, 128);
    assert_eq!(
        MmqPlan::new(4096, 8, 4096, 1, 132).smem_bytes(&Device::Amd("gfx90a".into())),
        0
    );
    // Unknown multiprocessor count: no split.
    assert_eq!(MmqPlan::new(4096, 7, 4096, 1, 0).splits, 1);
}

#[path = "../code_objects.rs"]
mod code_objects;
use code_objects::{amd_code_objects, amdgpu_mach};

#[test]
fn every_amd_code_object_holds_every_kernel_of_its_module() {
    if !built() {
        println!("skipped AMD code object check: kernels not built (run `cargo xtask kernels`)");
        return;
    }
    let mut checked = 0;
    for img in IMAGES.iter().filter(|i| i.target == "amd") {
        let objects = amd_code_objects(img.bytes)
            .unwrap_or_else(|| panic!("{}: neither a bundle nor an ELF", img.module));
        let archs: Vec<&str> = img.archs.split(',').collect();
        for arch in &archs {
            let (_, elf) = if archs.len() == 1 && objects.len() == 1 && objects[0].0.is_empty() {
                &objects[0]
            } else {
                objects.iter().find(|(a, _)| a == arch).unwrap_or_else(|| {
                    panic!("{}: no {arch} code object in the bundle", img.module)
                })
            };
            assert_eq!(
                amdgpu_mach(elf),
                Some(*arch),
                "{}: the {arch} code object was compiled for another processor",
                img.module
            );
            let module = Module::ALL
                .iter()
                .find(|m| m.stem() == img.module)
                .unwrap_or_else(|| panic!("unknown module {}", img.module));
            for k in KernelId::ALL.iter().filter(|k| k.module() == *module) {
                let sym = [b"\0", k.name().as_bytes(), b"\0"].concat();
                assert!(
                    contains(elf, &sym),
                    "{} missing from the {arch} code object of {}",
                    k.name(),
                    img.module
                );
            }
            checked += 1;
        }
    }
    println!("checked {checked} AMD code objects");
}

#[test]
fn grouped_plans_cover_every_experts_tiles() {
    assert_eq!(
        source_define("mmq.hip", "MOE_GROUP_THREADS"),
        MOE_GROUP_THREADS as usize
    );
    assert_eq!(
        source_define("mmq.hip", "MOE_GROUP_MAX_EXPERTS"),
        MOE_GROUP_MAX_EXPERTS
    );
    assert_eq!(source_define("mmq.hip", "GEMM_F32_TILE"), GEMM_F32_TILE);
    assert_eq!(
        source_define("mmq.hip", "GEMM_F32_THREADS"),
        GEMM_F32_THREADS as usize
    );
    // Qwen3-30B-A3B's prompt of 512 tokens: 4096 pairs over 128 experts (32 on average) take
    // 64-wide tiles; at most 64 full tiles plus one partial tile per expert.
    let p = MmqIdPlan::new(4096, 128, 768);
    assert_eq!((p.nt, p.grid), (64, [64 + 128, 12, 1]));
    // 10 pairs per expert: 16-wide tiles; 20: 32-wide.
    assert_eq!(MmqIdPlan::new(1280, 128, 2048).nt, 16);
    assert_eq!(MmqIdPlan::new(2560, 128, 2048).nt, 32);
    // Every split of a float product covers the row once, in shares of whole 16-value slabs.
    for (n, m, k, sms) in [
        (128usize, 512usize, 2048usize, 132usize),
        (8, 9, 4096, 132),
        (32, 100, 2880, 0),
        (7, 9, 130, 132),
    ] {
        let p = GemmF32Plan::new(n, m, k, sms);
        assert!(p.splits >= 1 && p.splits <= MMQ_MAX_SPLITS, "{p:?}");
        assert_eq!(p.kper % 16, 0, "{p:?}");
        assert!(
            p.splits * p.kper >= k && (p.splits - 1) * p.kper < k,
            "{p:?}"
        );
        assert_eq!(p.grid[2] as usize, p.splits);
    }
    // The router of a 512-token prompt: 16 tiles, 8 shares of 256 values.
    let p = GemmF32Plan::new(128, 512, 2048, 132);
    assert_eq!((p.splits, p.kper, p.grid), (8, 256, [8, 2, 8]));
}
