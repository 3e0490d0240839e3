//! The HIP backend's own memory besides weights, KV cache and the planned activation arena, as
//! a byte count that a placement can budget for before anything is allocated.

use super::HipDevice;

/// The scratch never starts below this (small graphs still quantize and combine through it).
const MIN_SCRATCH: u64 = 1 << 20;
/// Headroom for the small buffers that come and go (Q8 caches, stack tables).
const SLACK: u64 = 1 << 20;

impl HipDevice {
    /// Bytes this backend allocates for a run besides weights, KV cache and the planned arena:
    /// its scratch (f16 copies of one weight and of the activations for batched mat-muls,
    /// quantized activations, attention partials; grown to a power of two, at least 1 MiB), the
    /// pinned staging of the f32 read-back of `read_back` elements, and the scheduler's copy
    /// slots for `n_batch` rows of `row` elements crossing devices.
    ///
    /// `weights` are the shapes (ggml order: row length first) of the weights the device holds;
    /// `row` is the activation row width, which every mat-mul input reaches at least.
    pub fn workspace_bytes<'a>(
        weights: impl IntoIterator<Item = &'a [u64]>,
        n_batch: usize,
        row: usize,
        read_back: usize,
    ) -> u64 {
        let (mut w_elems, mut max_k) = (0u64, row as u64);
        for dims in weights {
            // Shapes come from the file: a product past u64 is no size any device has.
            let elems = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .unwrap_or(u64::MAX);
            w_elems = w_elems.max(elems);
            max_k = max_k.max(dims.first().copied().unwrap_or(0));
        }
        let n_batch = n_batch as u64;
        let scratch = w_elems
            .saturating_mul(2)
            .saturating_add(n_batch.saturating_mul(max_k).saturating_mul(4))
            .max(MIN_SCRATCH);
        let staging = (read_back as u64).saturating_mul(4);
        let copies = n_batch.saturating_mul(row as u64).saturating_mul(8);
        scratch
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX)
            .saturating_add(staging)
            .saturating_add(copies)
            .saturating_add(SLACK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_counts_scratch_staging_and_copies() {
        // A 4096 x 4096 weight and 64 rows of 4096: 32 MiB + 1 MiB of scratch, grown to 64 MiB.
        let w: [u64; 2] = [4096, 4096];
        let bytes = HipDevice::workspace_bytes([&w[..]], 64, 4096, 1000);
        assert_eq!(bytes, (64 << 20) + 4000 + 8 * 64 * 4096 + (1 << 20));
        // A wider input row (an FFN down matrix) counts for the scratch, not for the copies:
        // 128 MiB of f16 weight + 4 MiB of f16 activations, grown to 256 MiB.
        let down: [u64; 2] = [16384, 4096];
        let more = HipDevice::workspace_bytes([&w[..], &down[..]], 64, 4096, 1000);
        assert_eq!(more, (256 << 20) + 4000 + 8 * 64 * 4096 + (1 << 20));
        // Nothing on the device still keeps the 1 MiB minimum scratch.
        let none = HipDevice::workspace_bytes([], 1, 8, 0);
        assert_eq!(none, (1 << 20) + 64 + (1 << 20));
    }

    #[test]
    fn sizes_past_any_device_saturate_instead_of_wrapping() {
        // Shapes and counts from a hostile file: the estimate is "more than any GPU has",
        // never a small wrapped number that would pass a fit check.
        let huge: [u64; 3] = [1 << 40, 1 << 40, 1 << 40];
        let bytes = HipDevice::workspace_bytes([&huge[..]], usize::MAX, usize::MAX, usize::MAX);
        assert_eq!(bytes, u64::MAX);
        let wide: [u64; 2] = [u64::MAX, 2];
        assert_eq!(HipDevice::workspace_bytes([&wide[..]], 1, 1, 1), u64::MAX);
    }
}
