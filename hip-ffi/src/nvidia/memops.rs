//! The parameters of batched stream memory operations (`cuStreamBatchMemOp`).

use crate::api::DevicePtr;
use crate::sys::cuda as cu;

/// Operations the driver takes per `cuStreamBatchMemOp` call.
pub(super) const BATCH_MAX: usize = 256;

/// One 32-bit write operation per `(address, value)`, ordered after earlier work (flags 0).
pub(super) fn write_ops(words: &[(DevicePtr, u32)]) -> Vec<cu::CUstreamBatchMemOpParams> {
    use cu::CUstreamBatchMemOpType_enum as op;
    words
        .iter()
        .map(|&(dst, value)| {
            let mut p = cu::CUstreamBatchMemOpParams { pad: [0; 6] };
            p.writeValue.operation = op::CU_STREAM_MEM_OP_WRITE_VALUE_32;
            p.writeValue.address = dst.0;
            p.writeValue.__bindgen_anon_1.value = value;
            p.writeValue.flags = 0;
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_operations_carry_their_word_and_nothing_else() {
        let ops = write_ops(&[(DevicePtr(0x1000), 7), (DevicePtr(0x2004), u32::MAX)]);
        assert_eq!(ops.len(), 2);
        for (p, (addr, value)) in ops.iter().zip([(0x1000u64, 7u32), (0x2004, u32::MAX)]) {
            // SAFETY: `write_ops` zeroed the whole union and then set the write's fields.
            let (w, pad) = unsafe { (p.writeValue, p.pad) };
            assert_eq!(
                w.operation,
                cu::CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_WRITE_VALUE_32
            );
            assert_eq!(w.address, addr);
            // SAFETY: a 32-bit write sets the value union's `value`.
            assert_eq!(unsafe { w.__bindgen_anon_1.value }, value);
            assert_eq!(w.flags, 0);
            // Words of 8 bytes: operation, address, value, flags, alias, unused. The value's
            // upper half, the flags' padding, the driver's alias and the rest stay zero.
            assert_eq!(pad[1], addr);
            assert_eq!(pad[2], u64::from(value));
            assert_eq!(&pad[3..], &[0, 0, 0]);
        }
        // The driver reads 48-byte operations (CUDA's `pad[6]` of 64-bit words).
        assert_eq!(std::mem::size_of::<cu::CUstreamBatchMemOpParams>(), 48);
    }
}
