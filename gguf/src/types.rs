//! The ggml tensor type table: ids as stored in GGUF files, block sizes and bytes per block.
//!
//! Numbers follow ggml's `ggml_type_traits` table; `gguf-py`'s `GGML_QUANT_SIZES` is the oracle
//! the tests compare against.

use std::fmt;

/// Number of values in a K-quant super-block.
pub const QK_K: usize = 256;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor element type, with the numeric id used in GGUF tensor infos.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types, reason = "names match ggml's GGML_TYPE_* spelling")]
        #[repr(u32)]
        pub enum GgmlType {
            $(
                #[doc = concat!("ggml's `", $name, "` (GGUF id ", stringify!($id), ").")]
                $variant = $id,
            )*
        }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with GGUF id `id`, if it is one ggml still defines.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's lower-case name (`"q4_K"`, `"f16"`...).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Values per block (1 for plain scalar types).
            pub fn block_size(self) -> usize {
                match self {
                    $(GgmlType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self {
                    $(GgmlType::$variant => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "f32", 1, 4;
    F16 = 1, "f16", 1, 2;
    Q4_0 = 2, "q4_0", 32, 18;
    Q4_1 = 3, "q4_1", 32, 20;
    Q5_0 = 6, "q5_0", 32, 22;
    Q5_1 = 7, "q5_1", 32, 24;
    Q8_0 = 8, "q8_0", 32, 34;
    Q8_1 = 9, "q8_1", 32, 36;
    Q2_K = 10, "q2_K", QK_K, 84;
    Q3_K = 11, "q3_K", QK_K, 110;
    Q4_K = 12, "q4_K", QK_K, 144;
    Q5_K = 13, "q5_K", QK_K, 176;
    Q6_K = 14, "q6_K", QK_K, 210;
    Q8_K = 15, "q8_K", QK_K, 292;
    IQ2_XXS = 16, "iq2_xxs", QK_K, 66;
    IQ2_XS = 17, "iq2_xs", QK_K, 74;
    IQ3_XXS = 18, "iq3_xxs", QK_K, 98;
    IQ1_S = 19, "iq1_s", QK_K, 50;
    IQ4_NL = 20, "iq4_nl", 32, 18;
    IQ3_S = 21, "iq3_s", QK_K, 110;
    IQ2_S = 22, "iq2_s", QK_K, 82;
    IQ4_XS = 23, "iq4_xs", QK_K, 136;
    I8 = 24, "i8", 1, 1;
    I16 = 25, "i16", 1, 2;
    I32 = 26, "i32", 1, 4;
    I64 = 27, "i64", 1, 8;
    F64 = 28, "f64", 1, 8;
    IQ1_M = 29, "iq1_m", QK_K, 56;
    BF16 = 30, "bf16", 1, 2;
    TQ1_0 = 34, "tq1_0", QK_K, 54;
    TQ2_0 = 35, "tq2_0", QK_K, 66;
    MXFP4 = 39, "mxfp4", 32, 17;
    NVFP4 = 40, "nvfp4", 64, 36;
    Q1_0 = 41, "q1_0", 128, 18;
    Q2_0 = 42, "q2_0", 64, 18;
}

impl GgmlType {
    /// True for block-quantized types (everything but the plain int/float types).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by one row of `n` values, or `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(31), None);
    }

    #[test]
    fn row_bytes_checks_block_multiple() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
    }
}
