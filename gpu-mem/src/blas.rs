//! A BLAS handle bound to one stream with host pointer mode: SGEMM and f32-compute `gemmEx`
//! (f16/bf16/f32 operands), plain and strided-batched, with operand sizes checked.

use bytemuck::Pod;
use hip_ffi::{Batch, BlasHandle, GemmEx, GemmType, Op, PointerMode};

use crate::buffer::{DeviceView, DeviceViewMut};
use crate::error::{GpuError, Result};
use crate::stream::Stream;

/// Element types `gemmEx` takes.
pub trait GemmElem: Pod {
    /// The BLAS type tag.
    const TYPE: GemmType;
}

impl GemmElem for f32 {
    const TYPE: GemmType = GemmType::F32;
}
impl GemmElem for half::f16 {
    const TYPE: GemmType = GemmType::F16;
}
impl GemmElem for half::bf16 {
    const TYPE: GemmType = GemmType::BF16;
}

/// Shape of a column-major GEMM: C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Whether A is used as stored or transposed.
    pub trans_a: Op,
    /// Whether B is used as stored or transposed.
    pub trans_b: Op,
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Columns of op(A), rows of op(B).
    pub k: usize,
    /// Leading dimension of A (elements between columns as stored).
    pub lda: usize,
    /// Leading dimension of B.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
}

impl GemmShape {
    /// Elements each operand must hold: `(a, b, c)`.
    pub fn required_lens(&self) -> Result<(usize, usize, usize)> {
        let need = |rows: usize, cols: usize, ld: usize, name: &str| -> Result<usize> {
            if ld < rows.max(1) {
                return Err(GpuError::InvalidArgument(format!(
                    "leading dimension of {name} is {ld}, below its {rows} rows"
                )));
            }
            if cols == 0 {
                return Ok(0);
            }
            ld.checked_mul(cols - 1)
                .and_then(|x| x.checked_add(rows))
                .ok_or_else(|| GpuError::InvalidArgument(format!("{name} size overflows")))
        };
        let (ar, ac) = if self.trans_a == Op::N {
            (self.m, self.k)
        } else {
            (self.k, self.m)
        };
        let (br, bc) = if self.trans_b == Op::N {
            (self.k, self.n)
        } else {
            (self.n, self.k)
        };
        Ok((
            need(ar, ac, self.lda, "A")?,
            need(br, bc, self.ldb, "B")?,
            need(self.m, self.n, self.ldc, "C")?,
        ))
    }

    fn ints(&self) -> Result<[i32; 6]> {
        let c = |v: usize, n: &str| {
            i32::try_from(v)
                .map_err(|_| GpuError::InvalidArgument(format!("{n} = {v} exceeds a C int")))
        };
        Ok([
            c(self.m, "m")?,
            c(self.n, "n")?,
            c(self.k, "k")?,
            c(self.lda, "lda")?,
            c(self.ldb, "ldb")?,
            c(self.ldc, "ldc")?,
        ])
    }
}

fn check_len(name: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(GpuError::InvalidArgument(format!(
            "operand {name} holds {have} elements, the GEMM reads {need}"
        )));
    }
    Ok(())
}

/// A BLAS handle serving one stream (one handle per stream, created once).
pub struct Blas<'s> {
    stream: &'s Stream,
    handle: BlasHandle,
}

impl std::fmt::Debug for Blas<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").finish()
    }
}

impl<'s> Blas<'s> {
    /// Creates a handle, binds it to `stream` and sets host pointer mode.
    pub fn new(stream: &'s Stream) -> Result<Blas<'s>> {
        let dev = stream.device();
        dev.bind()?;
        let handle = dev.api().blas_create()?;
        let blas = Blas { stream, handle };
        // SAFETY: the handle was just created and the stream outlives `blas`.
        unsafe {
            dev.api().blas_set_stream(handle, stream.handle())?;
            dev.api().blas_set_pointer_mode(handle, PointerMode::Host)?;
        }
        Ok(blas)
    }

    /// The stream the handle queues on.
    pub fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// f32 GEMM.
    pub fn sgemm(
        &self,
        s: &GemmShape,
        alpha: f32,
        a: &DeviceView<'_, f32>,
        b: &DeviceView<'_, f32>,
        beta: f32,
        c: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        // BLAS calls are not recorded: a capture holding one cannot be replayed safely.
        self.stream.note_unknown("a BLAS call");
        let (na, nb, nc) = s.required_lens()?;
        check_len("A", a.len(), na)?;
        check_len("B", b.len(), nb)?;
        check_len("C", c.len(), nc)?;
        let [m, n, k, lda, ldb, ldc] = s.ints()?;
        let dev = self.stream.device();
        dev.bind()?;
        // SAFETY: operand sizes are checked above; alpha/beta are host f32 (host pointer mode)
        // read during the call.
        Ok(unsafe {
            dev.api().sgemm(
                self.handle,
                s.trans_a,
                s.trans_b,
                m,
                n,
                k,
                &alpha,
                a.ptr(),
                lda,
                b.ptr(),
                ldb,
                &beta,
                c.ptr(),
                ldc,
            )
        }?)
    }

    /// Mixed-precision GEMM with f32 compute.
    pub fn gemm_ex<A: GemmElem, B: GemmElem, C: GemmElem>(
        &self,
        s: &GemmShape,
        alpha: f32,
        a: &DeviceView<'_, A>,
        b: &DeviceView<'_, B>,
        beta: f32,
        c: &mut DeviceViewMut<'_, C>,
    ) -> Result<()> {
        // BLAS calls are not recorded: a capture holding one cannot be replayed safely.
        self.stream.note_unknown("a BLAS call");
        self.gemm_batched(s, alpha, a, b, beta, c, None)
    }

    /// Strided-batched mixed-precision GEMM: matrix `i` of each operand starts `i * stride`
    /// elements after the first.
    #[allow(clippy::too_many_arguments, reason = "a GEMM has this many operands")]
    pub fn gemm_strided_batched_ex<A: GemmElem, B: GemmElem, C: GemmElem>(
        &self,
        s: &GemmShape,
        alpha: f32,
        a: &DeviceView<'_, A>,
        stride_a: usize,
        b: &DeviceView<'_, B>,
        stride_b: usize,
        beta: f32,
        c: &mut DeviceViewMut<'_, C>,
        stride_c: usize,
        count: usize,
    ) -> Result<()> {
        // BLAS calls are not recorded: a capture holding one cannot be replayed safely.
        self.stream.note_unknown("a BLAS call");
        self.gemm_batched(
            s,
            alpha,
            a,
            b,
            beta,
            c,
            Some((stride_a, stride_b, stride_c, count)),
        )
    }

    #[allow(clippy::too_many_arguments, reason = "a GEMM has this many operands")]
    fn gemm_batched<A: GemmElem, B: GemmElem, C: GemmElem>(
        &self,
        s: &GemmShape,
        alpha: f32,
        a: &DeviceView<'_, A>,
        b: &DeviceView<'_, B>,
        beta: f32,
        c: &mut DeviceViewMut<'_, C>,
        batch: Option<(usize, usize, usize, usize)>,
    ) -> Result<()> {
        let (na, nb, nc) = s.required_lens()?;
        let total = |one: usize, stride: usize, count: usize| -> Result<usize> {
            if count == 0 {
                return Ok(0);
            }
            stride
                .checked_mul(count - 1)
                .and_then(|x| x.checked_add(one))
                .ok_or_else(|| GpuError::InvalidArgument("batched operand size overflows".into()))
        };
        let (ta, tb, tc) = match batch {
            Some((sa, sb, sc, n)) => (total(na, sa, n)?, total(nb, sb, n)?, total(nc, sc, n)?),
            None => (na, nb, nc),
        };
        check_len("A", a.len(), ta)?;
        check_len("B", b.len(), tb)?;
        check_len("C", c.len(), tc)?;
        let [m, n, k, lda, ldb, ldc] = s.ints()?;
        let args = GemmEx {
            trans_a: s.trans_a,
            trans_b: s.trans_b,
            m,
            n,
            k,
            alpha: &alpha,
            a: a.ptr(),
            a_type: A::TYPE,
            lda,
            b: b.ptr(),
            b_type: B::TYPE,
            ldb,
            beta: &beta,
            c: c.ptr(),
            c_type: C::TYPE,
            ldc,
        };
        let dev = self.stream.device();
        dev.bind()?;
        match batch {
            // SAFETY: operand sizes are checked above; scalars are host f32 read during the call.
            None => Ok(unsafe { dev.api().gemm_ex(self.handle, &args) }?),
            Some((sa, sb, sc, count)) => {
                let i64_of = |v: usize| {
                    i64::try_from(v)
                        .map_err(|_| GpuError::InvalidArgument(format!("stride {v} too large")))
                };
                let batch = Batch {
                    stride_a: i64_of(sa)?,
                    stride_b: i64_of(sb)?,
                    stride_c: i64_of(sc)?,
                    count: i32::try_from(count).map_err(|_| {
                        GpuError::InvalidArgument(format!("batch count {count} too large"))
                    })?,
                };
                // SAFETY: as above, for every matrix of the batch (sizes checked with strides).
                Ok(unsafe {
                    dev.api()
                        .gemm_strided_batched_ex(self.handle, &args, &batch)
                }?)
            }
        }
    }
}

impl Drop for Blas<'_> {
    fn drop(&mut self) {
        let dev = self.stream.device();
        // SAFETY: the handle is live and no longer used; its queued work is stream-ordered.
        if let Err(e) = unsafe { dev.api().blas_destroy(self.handle) } {
            dev.record_error("hipblasDestroy", e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_sizes_follow_transposes_and_leading_dims() {
        let s = GemmShape {
            trans_a: Op::N,
            trans_b: Op::N,
            m: 4,
            n: 3,
            k: 2,
            lda: 4,
            ldb: 2,
            ldc: 4,
        };
        assert_eq!(s.required_lens().unwrap(), (8, 6, 12));
        let t = GemmShape {
            trans_a: Op::T,
            trans_b: Op::T,
            m: 4,
            n: 3,
            k: 2,
            lda: 2,
            ldb: 3,
            ldc: 5,
        };
        assert_eq!(t.required_lens().unwrap(), (8, 6, 5 * 2 + 4));
        let bad = GemmShape { lda: 1, ..s };
        assert!(bad.required_lens().is_err());
    }
}
