//! Opening vendor libraries by a list of candidate file names, remembering why each failed.

use std::path::PathBuf;

use crate::error::LoadError;

/// Where the vendors' toolkits are installed, searched after the loader path. Libraries read no
/// environment: the `rocmforge` binary fills this from `ROCM_PATH` and `CUDA_PATH`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstallDirs {
    /// ROCm's prefix: `<it>/lib` is searched for HIP, hipBLAS and RCCL before `/opt/rocm/lib`.
    pub rocm: Option<PathBuf>,
    /// CUDA's prefix: `<it>/lib64` is searched for cuBLAS and NCCL after the loader path (the
    /// driver library comes with the driver, never with the toolkit).
    pub cuda: Option<PathBuf>,
}

/// Candidate file names for the HIP runtime, newest first, then in ROCm's library directories.
pub fn hip_candidates(dirs: &InstallDirs) -> Vec<String> {
    with_rocm_dirs(
        &[
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
            "libamdhip64.so",
        ],
        dirs,
    )
}

/// Candidate file names for hipBLAS, newest first, then in ROCm's library directories.
pub fn hipblas_candidates(dirs: &InstallDirs) -> Vec<String> {
    with_rocm_dirs(
        &[
            "libhipblas.so.3",
            "libhipblas.so.2",
            "libhipblas.so.1",
            "libhipblas.so.0",
            "libhipblas.so",
        ],
        dirs,
    )
}

/// Candidate file names for the CUDA driver library.
pub fn cuda_candidates() -> Vec<String> {
    vec!["libcuda.so.1".into(), "libcuda.so".into()]
}

/// Candidate file names for cuBLAS, newest first, then in CUDA's library directory.
pub fn cublas_candidates(dirs: &InstallDirs) -> Vec<String> {
    let mut v: Vec<String> = [
        "libcublas.so.13",
        "libcublas.so.12",
        "libcublas.so.11",
        "libcublas.so",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(cuda) = &dirs.cuda {
        let dir = cuda.join("lib64");
        for n in ["libcublas.so.13", "libcublas.so.12", "libcublas.so.11"] {
            v.push(dir.join(n).to_string_lossy().into_owned());
        }
    }
    v
}

/// `names` as the loader finds them, then in ROCm's library directories (`<dirs.rocm>/lib`,
/// `/opt/rocm/lib`).
pub(crate) fn with_rocm_dirs(names: &[&str], dirs: &InstallDirs) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut lib_dirs = Vec::new();
    if let Some(r) = &dirs.rocm {
        lib_dirs.push(r.join("lib"));
    }
    lib_dirs.push(PathBuf::from("/opt/rocm/lib"));
    for d in lib_dirs {
        for n in names {
            v.push(d.join(n).to_string_lossy().into_owned());
        }
    }
    v
}

/// A library opened from one of the candidates.
#[derive(Debug)]
pub struct Loaded {
    /// The open library; symbols are resolved from it.
    pub library: libloading::Library,
    /// The candidate that opened.
    pub name: String,
}

/// Opens the first candidate that loads; the error lists every candidate with its failure.
pub fn open_first(what: &'static str, candidates: &[String]) -> Result<Loaded, LoadError> {
    let mut tried = Vec::with_capacity(candidates.len());
    for name in candidates {
        // SAFETY: loading a vendor library runs its initialisers; the candidates are the vendor's
        // own sonames (or paths under the vendor's install directory), whose initialisers are
        // designed to run in any process.
        match unsafe { libloading::Library::new(name) } {
            Ok(library) => {
                tracing::debug!(library = %name, "loaded {what}");
                return Ok(Loaded {
                    library,
                    name: name.clone(),
                });
            }
            Err(e) => tried.push((name.clone(), short_reason(&e))),
        }
    }
    Err(LoadError { what, tried })
}

/// dlopen messages repeat the file name; keep the reason.
fn short_reason(e: &libloading::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(": ") {
        Some((_, tail)) if !tail.is_empty() => tail.to_owned(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_all_listed() {
        let names = vec![
            "librocmforge-does-not-exist.so.9".to_owned(),
            "/nonexistent/dir/libalso-missing.so".to_owned(),
        ];
        let err = open_first("test library", &names).expect_err("nothing there to load");
        assert_eq!(err.tried.len(), 2);
        let text = err.to_string();
        assert!(text.contains("could not load the test library"), "{text}");
        for n in &names {
            assert!(text.contains(n.as_str()), "{text} lacks {n}");
        }
    }

    #[test]
    fn empty_candidate_list_says_so() {
        let err = open_first("x", &[]).expect_err("no candidates");
        assert!(err.to_string().contains("tried nothing"));
    }

    #[test]
    fn candidate_lists_name_the_sonames_in_order() {
        let none = InstallDirs::default();
        let hip = hip_candidates(&none);
        assert_eq!(hip[0], "libamdhip64.so.7");
        assert!(hip.iter().any(|c| c == "/opt/rocm/lib/libamdhip64.so.6"));
        let blas = hipblas_candidates(&none);
        assert_eq!(
            &blas[..4],
            &[
                "libhipblas.so.3",
                "libhipblas.so.2",
                "libhipblas.so.1",
                "libhipblas.so.0"
            ]
        );
        assert_eq!(cuda_candidates()[0], "libcuda.so.1");
        assert_eq!(
            cublas_candidates(&none),
            [
                "libcublas.so.13",
                "libcublas.so.12",
                "libcublas.so.11",
                "libcublas.so"
            ]
        );
    }

    #[test]
    fn install_dirs_come_after_the_loader_path() {
        let dirs = InstallDirs {
            rocm: Some("/opt/rocm-6.4.1".into()),
            cuda: Some("/usr/local/cuda-12.8".into()),
        };
        let hip = hip_candidates(&dirs);
        assert_eq!(
            &hip[4..6],
            &[
                "/opt/rocm-6.4.1/lib/libamdhip64.so.7",
                "/opt/rocm-6.4.1/lib/libamdhip64.so.6"
            ]
        );
        assert_eq!(hip[8], "/opt/rocm/lib/libamdhip64.so.7");
        assert_eq!(hip.len(), 12);
        let blas = cublas_candidates(&dirs);
        assert_eq!(blas[4], "/usr/local/cuda-12.8/lib64/libcublas.so.13");
        assert_eq!(blas.len(), 7);
    }
}
