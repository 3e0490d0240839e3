//! Quantization of f32 data into IQ4_NL and IQ4_XS without an importance matrix, in the operation
//! order of ggml's `quantize_iq4_nl`/`quantize_iq4_xs` (what `llama-quantize` writes), so the
//! bytes are identical to llama.cpp's.
//!
//! Both pick, per 32 values, the scale that best fits the non-linear code book with weights
//! `x^2`: a max-based start refined over 15 candidate inverse scales. IQ4_XS then stores those
//! scales as 6-bit multiples of one f16 scale per 256 values and re-picks the codes for them.

use super::blocks::*;
use super::iq_tables::IQ4NL_VALUES;
use crate::types::QK_K;

/// Groups whose largest magnitude is below this get scale 0 (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Candidate inverse scales on each side of the max-based one (ggml's `ntry`).
const NTRY: i32 = 7;

/// Index of the code-book value nearest `x` (the upper one on ties), by bisection as ggml's
/// `best_index_int8`, so ties break the same way.
#[inline(always)]
fn best_index(x: f32) -> u8 {
    let v = &IQ4NL_VALUES;
    let val = |i: usize| f32::from(v[i]);
    if x <= val(0) {
        return 0;
    }
    if x >= val(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < val(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - val(hi - 1) < val(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// Fits one 32-value group: writes its codes into `l` and returns the scale (signed; 0 for an
/// all-but-zero group, whose codes are left for the caller).
fn fit_group(x: &[f32], l: &mut [u8]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(IQ4NL_VALUES[0]);
    let mut id = 1.0 / (-max / v0);
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (o, &xv) in l.iter_mut().zip(x) {
        let k = best_index(id * xv);
        *o = k;
        let q = f32::from(IQ4NL_VALUES[usize::from(k)]);
        let w = xv * xv;
        sumqx += w * q * xv;
        sumq2 += w * q * q;
    }
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + i32::from(IQ4NL_VALUES[0])) as f32 / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for &xv in x {
            let q = f32::from(IQ4NL_VALUES[usize::from(best_index(id * xv))]);
            let w = xv * xv;
            sumqx += w * q * xv;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 codes per group: low nibbles hold values 0..16, high nibbles 16..32.
fn pack(l: &[u8], qs: &mut [u8]) {
    for (q, l) in qs.chunks_exact_mut(16).zip(l.chunks_exact(32)) {
        for j in 0..16 {
            q[j] = l[j] | (l[j + 16] << 4);
        }
    }
}

pub(crate) fn iq4_nl(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockIQ4NL] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let mut l = [0u8; 32];
        let d = fit_group(x, &mut l);
        b.d = f16_bytes(d);
        // The codes are picked again for the unrounded scale (a zero scale picks the code
        // nearest 0 everywhere).
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (o, &v) in l.iter_mut().zip(x) {
            *o = best_index(id * v);
        }
        pack(&l, &mut b.qs);
    }
}

pub(crate) fn iq4_xs(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockIQ4XS] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; QK_K / 32];
        let (mut amax_scale, mut max_scale) = (0f32, 0f32);
        for (ib, s) in scales.iter_mut().enumerate() {
            *s = fit_group(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = *s;
            }
        }
        // Negative zero when every group is zero, as in ggml (the f16 keeps the sign bit).
        let d = -max_scale / 32.0;
        b.d = f16_bytes(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        b.scales_l = [0; 4];
        for (ib, &s) in scales.iter().enumerate() {
            let ls = (s * id).round_ties_even().clamp(-32.0, 31.0) as i32;
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index(idl * x[j]);
            }
            let biased = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (biased & 0x0F) << (4 * (ib % 2));
            scales_h |= u16::from(biased >> 4) << (2 * ib);
        }
        b.scales_h = scales_h.to_le_bytes();
        pack(&l, &mut b.qs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::GgmlType;

    /// The generator of the C program that produced the pinned bytes (an LCG, 24-bit values
    /// in [-1, 1) scaled by powers of two, so both sides get the same f32s).
    struct Lcg(u32);

    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((self.0 >> 8) as i32 - (1 << 23)) as f32 * (1.0 / (1 << 23) as f32)
        }

        /// Kinds: 0 plain, 1 one outlier, 2 all positive, 3 all zero, 4 below the zero
        /// threshold, 5 every other 32 values 100x smaller.
        fn fill(&mut self, x: &mut [f32], kind: usize, scale: f32) {
            let n = x.len();
            for (i, o) in x.iter_mut().enumerate() {
                let mut v = self.next() * scale;
                match kind {
                    2 => v = v.abs(),
                    3 => v = 0.0,
                    4 => v *= 1e-18,
                    5 if (i / 32) % 2 == 1 => v *= 0.01,
                    _ => {}
                }
                *o = v;
            }
            if kind == 1 {
                x[n / 3] = 7.5 * scale;
            }
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn fnv(b: &[u8]) -> u64 {
        b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
            (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
        crate::quants::quantize(ty, x).expect("quantize")
    }

    // The expected bytes come from llama.cpp 0c1e57098's own quantizer (the sdist of
    // llama-cpp-python 0.3.36, see scripts/llamacpp.sh): scripts/iq4_expected.c, linked against
    // its libggml-base.so, calls `ggml_quantize_chunk(type, x, q, 0, nrows, n_per_row, NULL)`
    // (the call `llama-quantize` makes without an imatrix) on the values `Lcg::fill` makes:
    // one block of each kind from seed `1 + kind` at scale 0.02, and for the hash (FNV-1a 64
    // over all bytes) 64 blocks of kind `b % 6` at scale `0.001 * (1 + b % 11)` from seed 1000.
    const IQ4_NL_BLOCKS: [&str; 6] = [
        "4109e345c89c31151d4920cba3563adef32f",
        "d69499886987777979889897909998878888",
        "f68823573143653165755063221217031481",
        "000088888888888888888888888888888888",
        "000088888888888888888888888888888888",
        "84885da1e0014b0fa04f360067e1c9161b0c",
    ];
    const IQ4_XS_BLOCKS: [&str; 6] = [
        "5700c33f2ff0fe4fe345b89c31151d4920cba3563adef32f6b10baf709d021f4a0f0beeb24aee85e53617fff\
         907319ba35c114189a9eb1f3abfd7748fec4b075ab11f4e3032d980aa9270797e01c0ffc384e456bdf443d1a\
         5cabd8d8f6d04ce11ebb1a172cc34bb54e86fe164ad18a74d7e170b12ea62af8dbbc6d4fad3b50532e230527\
         0bb27ad8",
        "6b028a554440bccd0347f26dfcb1d257381c2c11095d8747f42a8df7040ebd6e5caebcdf74f21fdf89787779\
         770879978978866987997778aee4630792de06da996cdbe7b7bb7094121334b4f9322fbc0f2bfee27c5ce6f0\
         ffd23cb5124256d1887995a732c1b7eac3f08f4dd2d1bff0fa6b6023a54922feb8c101a118aaf292699d64ff\
         bd88e28c",
        "5200000011321270235731436531657550632212170314812362423602256420462303681172241527332748\
         2771722605540305650171166050412716245202854460134417461010507021616061315431201044041515\
         4422202207520762116223467024456657151623522843267535453354474130852656126106623163031238\
         31311120",
        "0080aaaa00000000888888888888888888888888888888888888888888888888888888888888888888888888\
         8888888888888888888888888888888888888888888888888888888888888888888888888888888888888888\
         8888888888888888888888888888888888888888888888888888888888888888888888888888888888888888\
         88888888",
        "0080aaaa00000000888888888888888888888888888888888888888888888888888888888888888888888888\
         8888888888888888888888888888888888888888888888888888888888888888888888888888888888888888\
         8888888888888888888888888888888888888888888888888888888888888888888888888888888888888888\
         88888888",
        "54808b880c0002025da2e0014b0fa04f360067e1c9161b0c8888888888888888888888888888888876f32b22\
         5e32de0fd6b4d124dc661fde88888888888888888888888888888888fdefdcaa3266f4ead7c7040abde5fc1a\
         88888888888888888888888888888888710ddde0805b07f0c34611ff55dd14a3888888888888888888888888\
         88888888",
    ];
    const IQ4_NL_BULK_FNV: u64 = 0x7a56_253d_84df_aa62;
    const IQ4_XS_BULK_FNV: u64 = 0x88fd_f877_9c34_ce14;

    #[test]
    fn iq4_bytes_equal_llama_cpp() {
        for (ty, bs, pinned, bulk) in [
            (GgmlType::IQ4_NL, 32, &IQ4_NL_BLOCKS, IQ4_NL_BULK_FNV),
            (GgmlType::IQ4_XS, QK_K, &IQ4_XS_BLOCKS, IQ4_XS_BULK_FNV),
        ] {
            for (kind, want) in pinned.iter().enumerate() {
                let mut x = vec![0f32; bs];
                Lcg(1 + kind as u32).fill(&mut x, kind, 0.02);
                assert_eq!(hex(&quantize(ty, &x)), *want, "{ty} kind {kind}");
            }
            let mut rng = Lcg(1000);
            let mut x = vec![0f32; 64 * bs];
            for (b, blk) in x.chunks_exact_mut(bs).enumerate() {
                rng.fill(blk, b % 6, 0.001 * (1 + b % 11) as f32);
            }
            assert_eq!(fnv(&quantize(ty, &x)), bulk, "{ty} bulk");
        }
    }

    #[test]
    fn nearest_code_breaks_ties_high_and_saturates() {
        assert_eq!(best_index(-1000.0), 0);
        assert_eq!(best_index(1000.0), 15);
        assert_eq!(best_index(0.0), 8);
        // Half way between -10 and 1: the upper code, as ggml's strict comparison gives.
        assert_eq!(best_index(-4.5), 8);
        for (i, &v) in IQ4NL_VALUES.iter().enumerate() {
            assert_eq!(usize::from(best_index(f32::from(v))), i);
        }
    }

    #[test]
    fn iq4_round_trips_stay_within_bounds() {
        let mut rng = Lcg(7);
        let mut x = vec![0f32; 64 * QK_K];
        rng.fill(&mut x, 0, 0.02);
        // Sums of uniforms: closer to the bell-shaped weights the code book was made for.
        let x: Vec<f32> = x
            .chunks_exact(4)
            .flat_map(|c| {
                let s = c.iter().sum::<f32>();
                [s, s * 0.5 + c[0], s - c[1], c[2] - c[3]]
            })
            .collect();
        let rmse = |ty: GgmlType| {
            let y = crate::quants::dequantize_to_vec(ty, &quantize(ty, &x)).expect("dequantize");
            let err: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
            (err / norm).sqrt()
        };
        let (nl, xs, q4) = (
            rmse(GgmlType::IQ4_NL),
            rmse(GgmlType::IQ4_XS),
            rmse(GgmlType::Q4_0),
        );
        assert!(
            nl < 0.09 && xs < 0.09,
            "relative rmse iq4_nl {nl}, iq4_xs {xs}"
        );
        // The non-linear code book and the scale search must beat Q4_0's max-based grid.
        assert!(nl < q4 && xs < q4, "iq4_nl {nl}, iq4_xs {xs}, q4_0 {q4}");
    }
}
