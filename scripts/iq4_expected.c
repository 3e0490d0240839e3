// The expected IQ4_NL/IQ4_XS bytes pinned in gguf/src/quants/iq4quantize.rs, from llama.cpp's
// own quantizer: ggml_quantize_chunk without an imatrix, the call llama-quantize makes.
//
//   scripts/llamacpp.sh build-cpu /tmp/llama-cpu
//   gcc -O2 -o /tmp/iq4_expected scripts/iq4_expected.c -I/tmp/llama-cpu/ggml/include \
//     -L/tmp/llama-cpu/build/bin -lggml-base -Wl,-rpath,/tmp/llama-cpu/build/bin
//   /tmp/iq4_expected
#include <stdint.h>
#include <stdio.h>

#include "ggml.h"

static uint32_t st;

// 24-bit values in [-1, 1): exact in f32, so the Rust test regenerates the same inputs.
static float next(void) {
    st = st * 1664525u + 1013904223u;
    return (float)((int32_t)(st >> 8) - (1 << 23)) * (1.0f / (1 << 23));
}

// Kinds: 0 plain, 1 one outlier, 2 all positive, 3 all zero, 4 below the zero threshold,
// 5 every other 32 values 100x smaller.
static void fill(float *x, int n, int kind, float scale) {
    for (int i = 0; i < n; i++) {
        float v = next() * scale;
        if (kind == 2) v = v < 0 ? -v : v;
        if (kind == 3) v = 0.0f;
        if (kind == 4) v = v * 1e-18f;
        if (kind == 5 && (i / 32) % 2 == 1) v = v * 0.01f;
        x[i] = v;
    }
    if (kind == 1) x[n / 3] = 7.5f * scale;
}

static uint64_t fnv(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int main(void) {
    const enum ggml_type types[2] = {GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
    const char *names[2] = {"iq4_nl", "iq4_xs"};
    static float x[256 * 64];
    static uint8_t q[256 * 64];
    for (int t = 0; t < 2; t++) {
        const int bs = t == 0 ? 32 : 256;
        const size_t ts = t == 0 ? 18 : 136;
        for (int kind = 0; kind < 6; kind++) {
            st = 1 + kind;
            fill(x, bs, kind, 0.02f);
            ggml_quantize_chunk(types[t], x, q, 0, 1, bs, NULL);
            printf("%s kind %d: ", names[t], kind);
            for (size_t i = 0; i < ts; i++) printf("%02x", q[i]);
            printf("\n");
        }
        st = 1000;
        const int nb = 64;
        for (int b = 0; b < nb; b++) fill(x + b * bs, bs, b % 6, 0.001f * (float)(1 + b % 11));
        ggml_quantize_chunk(types[t], x, q, 0, nb, bs, NULL);
        printf("%s bulk fnv %016llx\n", names[t], (unsigned long long)fnv(q, nb * ts));
    }
    return 0;
}
