//! ggml's quantized block layouts as `#[repr(C)]`, alignment-1 Pod structs, so a tensor's bytes
//! can be viewed as `&[BlockQ4K]` with `bytemuck::cast_slice` wherever they lie in memory.
//!
//! Multi-byte fields are stored as little-endian byte arrays (GGUF is little-endian) and read
//! through accessor methods; f16 scales are `[u8; 2]` holding IEEE half bits. Field order and
//! sizes are ggml's (`ggml-common.h`); the layout test checks every size against the type table.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Reads an IEEE half stored little-endian.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

/// Exact half to single conversion that keeps NaN payloads and signalling bits unchanged, as
/// numpy does (hardware conversions quieten signalling NaNs).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    if h & 0x7C00 == 0x7C00 && h & 0x03FF != 0 {
        let sign = u32::from(h & 0x8000) << 16;
        f32::from_bits(sign | 0x7F80_0000 | (u32::from(h & 0x03FF) << 13))
    } else {
        f16::from_bits(h).to_f32()
    }
}

/// Stores `x` as an IEEE half, little-endian (round to nearest even).
#[inline(always)]
pub fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

macro_rules! blocks {
    ($($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $t:ty),* $(,)? })*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
        #[repr(C)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $t,)*
        }
    )*};
}

blocks! {
    /// Q4_0: 32 values = f16 scale + 16 bytes; value j<16 is the low nibble of `qs[j]`, value
    /// j>=16 the high nibble of `qs[j-16]`; x = d * (q - 8).
    BlockQ4_0 { /** scale (f16) */ d: [u8; 2], /** nibbles */ qs: [u8; 16] }
    /// Q4_1: x = d * q + m, nibbles as in Q4_0.
    BlockQ4_1 { /** scale (f16) */ d: [u8; 2], /** minimum (f16) */ m: [u8; 2], /** nibbles */ qs: [u8; 16] }
    /// Q5_0: x = d * (q - 16); bit 4 of value j is bit j of the little-endian u32 `qh`.
    BlockQ5_0 { /** scale (f16) */ d: [u8; 2], /** fifth bits */ qh: [u8; 4], /** nibbles */ qs: [u8; 16] }
    /// Q5_1: x = d * q + m, bits as in Q5_0.
    BlockQ5_1 { /** scale (f16) */ d: [u8; 2], /** minimum (f16) */ m: [u8; 2], /** fifth bits */ qh: [u8; 4], /** nibbles */ qs: [u8; 16] }
    /// Q8_0: x = d * q.
    BlockQ8_0 { /** scale (f16) */ d: [u8; 2], /** values */ qs: [i8; 32] }
    /// Q8_1: x = d * q; `s` = d * sum(q), used by dot products.
    BlockQ8_1 { /** scale (f16) */ d: [u8; 2], /** d * sum(qs) (f16) */ s: [u8; 2], /** values */ qs: [i8; 32] }
    /// Q2_K: 16 sub-blocks of 16; `scales[i]` low nibble = scale, high nibble = min;
    /// x = d * sc * q - dmin * m with 2-bit q.
    BlockQ2K { /** 4-bit scales and mins */ scales: [u8; 16], /** 2-bit values */ qs: [u8; 64], /** super scale (f16) */ d: [u8; 2], /** super min scale (f16) */ dmin: [u8; 2] }
    /// Q3_K: 2 low bits in `qs`, high bit in `hmask` (set = no -4 offset), 16 6-bit scales
    /// packed in 12 bytes, biased by 32.
    BlockQ3K { /** high bits */ hmask: [u8; 32], /** low 2 bits */ qs: [u8; 64], /** packed 6-bit scales */ scales: [u8; 12], /** super scale (f16) */ d: [u8; 2] }
    /// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes;
    /// x = d * sc * q - dmin * m.
    BlockQ4K { /** super scale (f16) */ d: [u8; 2], /** super min scale (f16) */ dmin: [u8; 2], /** packed 6-bit scales and mins */ scales: [u8; 12], /** nibbles */ qs: [u8; 128] }
    /// Q5_K: Q4_K plus a fifth bit per value in `qh`.
    BlockQ5K { /** super scale (f16) */ d: [u8; 2], /** super min scale (f16) */ dmin: [u8; 2], /** packed 6-bit scales and mins */ scales: [u8; 12], /** fifth bits */ qh: [u8; 32], /** nibbles */ qs: [u8; 128] }
    /// Q6_K: 4 low bits in `ql`, 2 high bits in `qh`, 16 signed 8-bit scales;
    /// x = d * scale * (q - 32).
    BlockQ6K { /** low nibbles */ ql: [u8; 128], /** high 2 bits */ qh: [u8; 64], /** scales */ scales: [i8; 16], /** super scale (f16) */ d: [u8; 2] }
    /// Q8_K: f32 scale, 256 values, 16 block sums (i16) for dot products.
    BlockQ8K { /** scale (f32) */ d: [u8; 4], /** values */ qs: [i8; 256], /** sums of 16-value groups (i16) */ bsums: [u8; 32] }
    /// IQ2_XXS: 8 groups of 32; each group is two u32: four 8-bit grid indices, then four 7-bit
    /// sign indices and a 4-bit scale in the top bits.
    BlockIQ2XXS { /** scale (f16) */ d: [u8; 2], /** packed grid, signs, scales (u16 x 32) */ qs: [u8; 64] }
    /// IQ2_XS: 32 u16 = 9-bit grid index + 7-bit sign index; 4-bit scales.
    BlockIQ2XS { /** scale (f16) */ d: [u8; 2], /** grid and sign indices (u16 x 32) */ qs: [u8; 64], /** 4-bit scales */ scales: [u8; 8] }
    /// IQ2_S: 10-bit grid indices (low 8 in `qs[..32]`, high 2 in `qh`), explicit sign bytes in
    /// `qs[32..]`, 4-bit scales.
    BlockIQ2S { /** scale (f16) */ d: [u8; 2], /** grid low bits, then signs */ qs: [u8; 64], /** grid high bits */ qh: [u8; 8], /** 4-bit scales */ scales: [u8; 8] }
    /// IQ3_XXS: 64 8-bit grid indices, then 8 u32 each holding four 7-bit sign indices and a
    /// 4-bit scale.
    BlockIQ3XXS { /** scale (f16) */ d: [u8; 2], /** grid indices, then signs and scales */ qs: [u8; 96] }
    /// IQ3_S: 9-bit grid indices (low 8 in `qs`, high bit in `qh`), explicit signs, 4-bit scales.
    BlockIQ3S { /** scale (f16) */ d: [u8; 2], /** grid low bits */ qs: [u8; 64], /** grid high bits */ qh: [u8; 8], /** sign bits */ signs: [u8; 32], /** 4-bit scales */ scales: [u8; 4] }
    /// IQ1_S: 11-bit grid indices (8 in `qs`, 3 in `qh`), 3-bit scales and a delta sign in `qh`.
    BlockIQ1S { /** scale (f16) */ d: [u8; 2], /** grid low bits */ qs: [u8; 32], /** high bits, scales, delta signs (u16 x 8) */ qh: [u8; 16] }
    /// IQ1_M: like IQ1_S with per-16 deltas; the f16 super scale is spread over the top nibbles
    /// of `scales`.
    BlockIQ1M { /** grid low bits */ qs: [u8; 32], /** high bits and delta signs */ qh: [u8; 16], /** 3-bit scales + scale nibbles (u16 x 4) */ scales: [u8; 8] }
    /// IQ4_NL: 32 4-bit indices into a fixed non-linear table, nibble order as Q4_0.
    BlockIQ4NL { /** scale (f16) */ d: [u8; 2], /** nibbles */ qs: [u8; 16] }
    /// IQ4_XS: IQ4_NL over 8 sub-blocks with 6-bit scales (low 4 in `scales_l`, high 2 in
    /// `scales_h`), biased by 32.
    BlockIQ4XS { /** scale (f16) */ d: [u8; 2], /** high 2 bits of scales (u16) */ scales_h: [u8; 2], /** low 4 bits of scales */ scales_l: [u8; 4], /** nibbles */ qs: [u8; 128] }
    /// TQ1_0: ternary values packed five per byte (base 3, fixed-point), four per byte in `qh`.
    BlockTQ1_0 { /** 5 trits per byte */ qs: [u8; 48], /** 4 trits per byte */ qh: [u8; 4], /** scale (f16) */ d: [u8; 2] }
    /// TQ2_0: ternary values stored as 2-bit q, x = d * (q - 1).
    BlockTQ2_0 { /** 2-bit values */ qs: [u8; 64], /** scale (f16) */ d: [u8; 2] }
    /// MXFP4: shared E8M0 exponent and 32 E2M1 values (nibble order as Q4_0).
    BlockMXFP4 { /** E8M0 exponent */ e: u8, /** nibbles */ qs: [u8; 16] }
    /// NVFP4: four 16-value sub-blocks, each with an unsigned E4M3 scale, of E2M1 values (in
    /// each sub-block the low nibbles hold the first 8 values, the high nibbles the next 8).
    BlockNVFP4 { /** UE4M3 sub-block scales */ d: [u8; 4], /** nibbles */ qs: [u8; 32] }
    /// Q1_0: one bit per value (bit j % 8 of byte j / 8), x = d when set, -d when clear.
    BlockQ1_0 { /** scale (f16) */ d: [u8; 2], /** bits */ qs: [u8; 16] }
    /// Q2_0: two bits per value (bits 2 * (j % 4) of byte j / 4), x = d * (q - 1).
    BlockQ2_0 { /** scale (f16) */ d: [u8; 2], /** 2-bit values */ qs: [u8; 16] }
}

/// Reads little-endian u16 number `i` from a byte array.
#[inline(always)]
pub fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

/// Reads little-endian u32 number `i` from a byte array.
#[inline(always)]
pub fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Unpacks the 6-bit scale and min of sub-block `j` (0..8) from the 12-byte Q4_K/Q5_K field.
#[inline(always)]
pub fn k4_scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Unpacks the sixteen 6-bit Q3_K scales (still biased by 32).
#[inline(always)]
pub fn q3k_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for i in 0..16 {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + (i % 4)] >> (2 * (i / 4))) & 3;
        out[i] = low | (high << 4);
    }
    out
}

impl BlockQ8K {
    /// The f32 scale.
    #[inline(always)]
    pub fn scale(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of values 16*i..16*i+16.
    #[inline(always)]
    pub fn bsum(&self, i: usize) -> i16 {
        u16_at(&self.bsums, i) as i16
    }
}
