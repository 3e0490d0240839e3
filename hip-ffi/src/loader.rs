//! Opening vendor libraries by a list of candidate file names, remembering why each failed.

use std::path::PathBuf;

use crate::error::LoadError;

/// Candidate file names for the HIP runtime, newest first, then `$ROCM_PATH/lib` and `/opt/rocm`.
pub fn hip_candidates() -> Vec<String> {
    with_rocm_dirs(&[
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
        "libamdhip64.so",
    ])
}

/// Candidate file names for hipBLAS.
pub fn hipblas_candidates() -> Vec<String> {
    with_rocm_dirs(&[
        "libhipblas.so.3",
        "libhipblas.so.2",
        "libhipblas.so.1",
        "libhipblas.so.0",
        "libhipblas.so",
    ])
}

/// Candidate file names for the CUDA driver library.
pub fn cuda_candidates() -> Vec<String> {
    vec!["libcuda.so.1".into(), "libcuda.so".into()]
}

/// Candidate file names for cuBLAS, newest first.
pub fn cublas_candidates() -> Vec<String> {
    let mut v: Vec<String> = [
        "libcublas.so.13",
        "libcublas.so.12",
        "libcublas.so.11",
        "libcublas.so",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(cuda) = std::env::var_os("CUDA_PATH") {
        let dir = PathBuf::from(cuda).join("lib64");
        for n in ["libcublas.so.13", "libcublas.so.12", "libcublas.so.11"] {
            v.push(dir.join(n).to_string_lossy().into_owned());
        }
    }
    v
}

/// `names` as the loader finds them, then in ROCm's library directories (`$ROCM_PATH/lib`,
/// `/opt/rocm/lib`).
pub(crate) fn with_rocm_dirs(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut dirs = Vec::new();
    if let Some(r) = std::env::var_os("ROCM_PATH") {
        dirs.push(PathBuf::from(r).join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    for d in dirs {
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
        let hip = hip_candidates();
        assert_eq!(hip[0], "libamdhip64.so.7");
        assert!(hip.iter().any(|c| c == "/opt/rocm/lib/libamdhip64.so.6"));
        let blas = hipblas_candidates();
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
            &cublas_candidates()[..3],
            &["libcublas.so.13", "libcublas.so.12", "libcublas.so.11"]
        );
    }
}
