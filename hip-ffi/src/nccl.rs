//! The collective communication library, loaded at run time: NCCL on NVIDIA, RCCL on AMD (RCCL
//! keeps NCCL's C API and symbol names, so one table serves both).
//!
//! Thin and `unsafe` where pointers or call order matter, like [`crate::HipApi`]: every status
//! becomes a `Result`, the safe communicator lives in `gpu-mem`. Calls that take a stream act on
//! the device the communicator was made for; the caller makes that device current.

use std::ffi::{c_int, CStr};
use std::path::PathBuf;
use std::process::Command;

use crate::api::{DevicePtr, Platform, StreamHandle};
use crate::error::{Error, NcclError, Result};
use crate::loader::{self, InstallDirs};
use crate::sys::nccl::{self as sys, ncclDataType_t as dt, ncclRedOp_t as op, NcclLib};

/// How to find the library. Libraries take options; the CLI fills [`NcclOptions::library`] from
/// its `ROCMFORGE_NCCL` environment variable and [`NcclOptions::dirs`] from `ROCM_PATH` and
/// `CUDA_PATH`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclOptions {
    /// A file to try before the usual places (a full path or a file name for the loader).
    pub library: Option<PathBuf>,
    /// The vendors' install prefixes, searched after the loader path.
    pub dirs: InstallDirs,
    /// Skip asking `python3` for its site-packages (where pip's `nvidia-nccl-cu13` puts
    /// `nvidia/nccl/lib/libnccl.so.2`).
    pub skip_python: bool,
}

/// Candidate files for `platform`'s collective library, in the order tried: the caller's file,
/// the loader path, the vendor's install directory ([`NcclOptions::dirs`]), and (NVIDIA)
/// Python's NCCL packages.
pub fn candidates(platform: Platform, opts: &NcclOptions) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(p) = &opts.library {
        v.push(p.to_string_lossy().into_owned());
    }
    match platform {
        Platform::Nvidia => {
            v.extend(["libnccl.so.2", "libnccl.so"].map(String::from));
            if let Some(cuda) = &opts.dirs.cuda {
                let dir = cuda.join("lib64");
                v.push(dir.join("libnccl.so.2").to_string_lossy().into_owned());
            }
            if !opts.skip_python {
                for dir in python_site_dirs() {
                    let lib = dir.join("nvidia/nccl/lib/libnccl.so.2");
                    v.push(lib.to_string_lossy().into_owned());
                }
            }
        }
        Platform::Amd => v.extend(loader::with_rocm_dirs(
            &["librccl.so.1", "librccl.so"],
            &opts.dirs,
        )),
    }
    v
}

/// The site-packages directories of `python3` (system, user), or none when there is no Python.
fn python_site_dirs() -> Vec<PathBuf> {
    const SCRIPT: &str =
        "import site\nfor d in site.getsitepackages() + [site.getusersitepackages()]: print(d)";
    let out = Command::new("python3").args(["-c", SCRIPT]).output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// Element types of collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// Unsigned byte.
    U8,
}

impl CollType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            CollType::F32 | CollType::I32 => 4,
            CollType::F16 | CollType::BF16 => 2,
            CollType::U8 => 1,
        }
    }

    fn raw(self) -> dt::Type {
        match self {
            CollType::F32 => dt::ncclFloat32,
            CollType::F16 => dt::ncclFloat16,
            CollType::BF16 => dt::ncclBfloat16,
            CollType::I32 => dt::ncclInt32,
            CollType::U8 => dt::ncclUint8,
        }
    }
}

/// Reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    fn raw(self) -> op::Type {
        match self {
            ReduceOp::Sum => op::ncclSum,
            ReduceOp::Max => op::ncclMax,
            ReduceOp::Min => op::ncclMin,
        }
    }
}

/// The rendezvous token of a communicator (`ncclUniqueId`): made by one rank, handed to all
/// (over any channel: it is plain bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// A communicator handle (`ncclComm_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct CommHandle(pub sys::ncclComm_t);

// SAFETY: an opaque token the library accepts from any thread (one thread at a time per
// communicator, which the owner in gpu-mem guarantees by taking `&mut`/locking).
unsafe impl Send for CommHandle {}
// SAFETY: as for Send; sharing the token shares no host memory.
unsafe impl Sync for CommHandle {}

/// The loaded collective library.
pub struct Nccl {
    lib: NcclLib,
    name: String,
    platform: Platform,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("library", &self.name)
            .field("platform", &self.platform)
            .finish()
    }
}

impl Nccl {
    /// Loads `platform`'s library (NCCL or RCCL) from the first candidate that opens and has
    /// every function rocmforge calls; the error lists every file tried.
    pub fn load(platform: Platform, opts: &NcclOptions) -> Result<Nccl> {
        let what = match platform {
            Platform::Nvidia => "NCCL library (libnccl.so.2; pip's nvidia-nccl-cu13 has one)",
            Platform::Amd => "RCCL library (librccl.so)",
        };
        let lib = loader::open_first(what, &candidates(platform, opts))?;
        // SAFETY: the table's functions are looked up by their C names in NCCL's own library;
        // their signatures are bindgen's from nccl.h, whose API RCCL keeps.
        let table = unsafe { NcclLib::from_library(lib.library) }.map_err(|e| {
            Error::Load(crate::error::LoadError {
                what,
                tried: vec![(lib.name.clone(), format!("missing symbol: {e}"))],
            })
        })?;
        Ok(Nccl {
            lib: table,
            name: lib.name,
            platform,
        })
    }

    /// The file that was loaded.
    pub fn library_name(&self) -> &str {
        &self.name
    }

    /// The platform whose library this is.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    fn check(&self, call: &'static str, r: sys::ncclResult_t::Type) -> Result<()> {
        if r == sys::ncclResult_t::ncclSuccess {
            return Ok(());
        }
        Err(Error::Nccl(NcclError {
            call,
            code: r,
            message: self.error_string(r),
        }))
    }

    /// The library's text for a status code.
    pub fn error_string(&self, code: u32) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { self.lib.ncclGetErrorString(code) };
        if p.is_null() {
            return format!("unknown status {code}");
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The version as NCCL encodes it (`major * 10000 + minor * 100 + patch` since 2.9).
    pub fn version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let r = unsafe { self.lib.ncclGetVersion(&mut v) };
        self.check("ncclGetVersion", r)?;
        Ok(v)
    }

    /// `major.minor.patch` of [`Nccl::version`].
    pub fn version_string(&self) -> Result<String> {
        let v = self.version()?;
        let (major, rest) = if v >= 10000 {
            (v / 10000, v % 10000)
        } else {
            (v / 1000, v % 1000)
        };
        Ok(format!("{major}.{}.{}", rest / 100, rest % 100))
    }

    /// A fresh rendezvous token (made by rank 0 of a multi-process communicator).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = sys::ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is a valid out-pointer.
        let r = unsafe { self.lib.ncclGetUniqueId(&mut id) };
        self.check("ncclGetUniqueId", r)?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    /// Joins rank `rank` of `nranks` to the communicator of `id` on the current device; blocks
    /// until every rank joined (call it from one thread or process per rank, or inside
    /// [`Nccl::group_start`]/[`Nccl::group_end`]).
    ///
    /// # Safety
    /// The calling thread's current device is the one this rank drives.
    pub unsafe fn comm_init_rank(
        &self,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
    ) -> Result<CommHandle> {
        let n = crate::error::c_int("ncclCommInitRank", "nranks", nranks as i64)?;
        let r_ = crate::error::c_int("ncclCommInitRank", "rank", rank as i64)?;
        let raw = sys::ncclUniqueId {
            internal: id.0.map(|b| b as std::ffi::c_char),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is passed by value.
        let r = unsafe { self.lib.ncclCommInitRank(&mut comm, n, raw, r_) };
        self.check("ncclCommInitRank", r)?;
        Ok(CommHandle(comm))
    }

    /// One communicator per device of `devices` (ordinals), all driven by this process; rank
    /// `i` is `devices[i]`.
    pub fn comm_init_all(&self, devices: &[i32]) -> Result<Vec<CommHandle>> {
        let n = crate::error::c_int("ncclCommInitAll", "devices", devices.len() as i64)?;
        let mut comms: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device; `devices` holds `n` ordinals.
        let r = unsafe {
            self.lib
                .ncclCommInitAll(comms.as_mut_ptr(), n, devices.as_ptr())
        };
        self.check("ncclCommInitAll", r)?;
        Ok(comms.into_iter().map(CommHandle).collect())
    }

    /// Frees a communicator after its queued work finished.
    ///
    /// # Safety
    /// `comm` is live and not used afterwards.
    pub unsafe fn comm_destroy(&self, comm: CommHandle) -> Result<()> {
        // SAFETY: the caller's guarantee.
        let r = unsafe { self.lib.ncclCommDestroy(comm.0) };
        self.check("ncclCommDestroy", r)
    }

    /// Frees a communicator at once, cancelling its pending work (a peer died or timed out).
    ///
    /// # Safety
    /// `comm` is live and not used afterwards.
    pub unsafe fn comm_abort(&self, comm: CommHandle) -> Result<()> {
        // SAFETY: the caller's guarantee.
        let r = unsafe { self.lib.ncclCommAbort(comm.0) };
        self.check("ncclCommAbort", r)
    }

    /// The communicator's asynchronous error (a failed peer, a network error): `Ok` while
    /// there is none.
    ///
    /// # Safety
    /// `comm` is live.
    pub unsafe fn comm_async_error(&self, comm: CommHandle) -> Result<()> {
        let mut e: sys::ncclResult_t::Type = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is live (caller), `e` a valid out-pointer.
        let r = unsafe { self.lib.ncclCommGetAsyncError(comm.0, &mut e) };
        self.check("ncclCommGetAsyncError", r)?;
        self.check("asynchronous collective", e)
    }

    /// Ranks in the communicator.
    ///
    /// # Safety
    /// `comm` is live.
    pub unsafe fn comm_count(&self, comm: CommHandle) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: `comm` is live (caller), `n` a valid out-pointer.
        let r = unsafe { self.lib.ncclCommCount(comm.0, &mut n) };
        self.check("ncclCommCount", r)?;
        Ok(n.max(0) as usize)
    }

    /// This communicator's rank.
    ///
    /// # Safety
    /// `comm` is live.
    pub unsafe fn comm_rank(&self, comm: CommHandle) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: `comm` is live (caller), `n` a valid out-pointer.
        let r = unsafe { self.lib.ncclCommUserRank(comm.0, &mut n) };
        self.check("ncclCommUserRank", r)?;
        Ok(n.max(0) as usize)
    }

    /// Queues an all-reduce of `count` elements on `stream` (`send == recv`: in place).
    ///
    /// # Safety
    /// `comm` and `stream` are live and belong to the current device; `send` and `recv` are
    /// device memory of it holding `count` elements of `ty`, valid until the stream passes the
    /// call; every rank queues the same collective.
    #[allow(clippy::too_many_arguments, reason = "mirrors ncclAllReduce")]
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        ty: CollType,
        red: ReduceOp,
        comm: CommHandle,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees; the stream handle is the platform's stream type.
        let r = unsafe {
            self.lib.ncclAllReduce(
                send.as_raw(),
                recv.as_raw(),
                count,
                ty.raw(),
                red.raw(),
                comm.0,
                stream.0.cast(),
            )
        };
        self.check("ncclAllReduce", r)
    }

    /// Queues an all-gather: every rank's `count` elements land in `recv` at `rank * count`.
    ///
    /// # Safety
    /// As [`Nccl::all_reduce`]; `recv` holds `count * ranks` elements and does not overlap
    /// `send` unless `send` is this rank's slot of it.
    pub unsafe fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        ty: CollType,
        comm: CommHandle,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees.
        let r = unsafe {
            self.lib.ncclAllGather(
                send.as_raw(),
                recv.as_raw(),
                count,
                ty.raw(),
                comm.0,
                stream.0.cast(),
            )
        };
        self.check("ncclAllGather", r)
    }

    /// Queues a send of `count` elements to rank `peer` (who queues the matching receive).
    ///
    /// # Safety
    /// As [`Nccl::all_reduce`] for `buf`.
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        ty: CollType,
        peer: usize,
        comm: CommHandle,
        stream: StreamHandle,
    ) -> Result<()> {
        let p = crate::error::c_int("ncclSend", "peer", peer as i64)?;
        // SAFETY: the caller's guarantees.
        let r = unsafe {
            self.lib
                .ncclSend(buf.as_raw(), count, ty.raw(), p, comm.0, stream.0.cast())
        };
        self.check("ncclSend", r)
    }

    /// Queues a receive of `count` elements from rank `peer`.
    ///
    /// # Safety
    /// As [`Nccl::all_reduce`] for `buf`, which nothing else touches until the stream passes
    /// the call.
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        ty: CollType,
        peer: usize,
        comm: CommHandle,
        stream: StreamHandle,
    ) -> Result<()> {
        let p = crate::error::c_int("ncclRecv", "peer", peer as i64)?;
        // SAFETY: the caller's guarantees.
        let r = unsafe {
            self.lib
                .ncclRecv(buf.as_raw(), count, ty.raw(), p, comm.0, stream.0.cast())
        };
        self.check("ncclRecv", r)
    }

    /// Opens a group: the calls up to [`Nccl::group_end`] are issued together (one thread
    /// driving several devices, or matched sends and receives).
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; groups nest.
        let r = unsafe { self.lib.ncclGroupStart() };
        self.check("ncclGroupStart", r)
    }

    /// Closes a group and issues its calls.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments; a call without an open group is reported as an error status.
        let r = unsafe { self.lib.ncclGroupEnd() };
        self.check("ncclGroupEnd", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_put_the_callers_file_first() {
        let opts = NcclOptions {
            library: Some("/x/libnccl-custom.so".into()),
            skip_python: true,
            ..Default::default()
        };
        let c = candidates(Platform::Nvidia, &opts);
        assert_eq!(c, ["/x/libnccl-custom.so", "libnccl.so.2", "libnccl.so"]);
        let a = candidates(Platform::Amd, &NcclOptions::default());
        assert_eq!(&a[..2], &["librccl.so.1", "librccl.so"]);
        assert!(a.iter().any(|x| x == "/opt/rocm/lib/librccl.so.1"));
        let with_dirs = NcclOptions {
            dirs: InstallDirs {
                rocm: Some("/opt/rocm-6.4.1".into()),
                cuda: Some("/usr/local/cuda-12.8".into()),
            },
            skip_python: true,
            ..Default::default()
        };
        let c = candidates(Platform::Nvidia, &with_dirs);
        assert_eq!(c[2], "/usr/local/cuda-12.8/lib64/libnccl.so.2");
        let a = candidates(Platform::Amd, &with_dirs);
        assert_eq!(
            &a[2..4],
            &[
                "/opt/rocm-6.4.1/lib/librccl.so.1",
                "/opt/rocm-6.4.1/lib/librccl.so"
            ]
        );
    }

    #[test]
    fn a_missing_library_is_a_typed_error_naming_every_file() {
        let opts = NcclOptions {
            library: Some("/nonexistent/librccl-nothere.so".into()),
            skip_python: true,
            ..Default::default()
        };
        // RCCL is not installed here (no ROCm): every candidate fails.
        if std::path::Path::new("/opt/rocm/lib/librccl.so.1").exists() {
            println!("skipped: RCCL is installed here");
            return;
        }
        let err = Nccl::load(Platform::Amd, &opts).expect_err("no RCCL here");
        let Error::Load(l) = &err else {
            panic!("expected a load error, got {err}")
        };
        assert!(l.tried.iter().any(|(n, _)| n.contains("librccl-nothere")));
        assert!(err.to_string().contains("RCCL library"), "{err}");
    }

    #[test]
    fn type_and_op_codes_follow_the_header() {
        // NCCL's and RCCL's values of the types and ops rocmforge uses.
        assert_eq!(CollType::F16.raw(), 6);
        assert_eq!(CollType::F32.raw(), 7);
        assert_eq!(CollType::BF16.raw(), 9);
        assert_eq!(ReduceOp::Sum.raw(), 0);
        assert_eq!(ReduceOp::Max.raw(), 2);
        assert_eq!(std::mem::size_of::<sys::ncclUniqueId>(), UNIQUE_ID_BYTES);
    }

    /// Loads NCCL where the machine has it (the loader path or pip's `nvidia-nccl-cu13`, which
    /// needs no GPU to answer its version) and checks the version call.
    #[test]
    fn nccl_loads_and_reports_its_version() {
        let nccl = match Nccl::load(Platform::Nvidia, &NcclOptions::default()) {
            Ok(n) => n,
            Err(e) => {
                println!("skipped: {e}");
                return;
            }
        };
        let v = nccl.version().expect("ncclGetVersion");
        assert!(
            v >= 2_00_00 || (2000..3000).contains(&v),
            "version code {v}"
        );
        let s = nccl.version_string().expect("version string");
        assert!(s.starts_with("2."), "{s} from {}", nccl.library_name());
        assert!(nccl.error_string(4).to_lowercase().contains("argument"));
    }
}
