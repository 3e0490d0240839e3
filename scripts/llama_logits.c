// Reference logits from llama.cpp's C API for rocmforge's family tests: for each prompt, the
// prompt's token ids (BOS added as the vocabulary says), the top 20 logits after it, then a
// greedy continuation with llama.cpp's top-2 gap at every step. Prints one JSON object.
//
//   llama_logits MODEL N_CTX N_GREEDY PROMPT...
//
// Runs on the CPU with 2 threads and flash attention off (llama.cpp's reference path, see
// DESIGN.md section 7). Built and run by scripts/family_goldens.sh.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define TOP 20

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c < 0x20) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

// Index of the largest logit and the gap to the second largest.
static int argmax(const float *l, int n, float *gap) {
    int best = 0, second = -1;
    for (int i = 1; i < n; i++) {
        if (l[i] > l[best]) {
            second = best;
            best = i;
        } else if (second < 0 || l[i] > l[second]) {
            second = i;
        }
    }
    *gap = second < 0 ? 0.0f : l[best] - l[second];
    return best;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL N_CTX N_GREEDY PROMPT...\n", argv[0]);
        return 2;
    }
    const int n_ctx = atoi(argv[2]);
    const int n_greedy = atoi(argv[3]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    printf("{\"n_vocab\": %d, \"n_ctx\": %d, \"prompts\": [", n_vocab, n_ctx);
    for (int p = 4; p < argc; p++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_token ids[1024];
        int n = llama_tokenize(vocab, argv[p], (int)strlen(argv[p]), ids, 1024, true, false);
        if (n < 0) {
            fprintf(stderr, "prompt too long\n");
            return 1;
        }
        printf("%s\n{\"text\": ", p > 4 ? "," : "");
        json_string(argv[p]);
        printf(", \"prompt_ids\": [");
        for (int i = 0; i < n; i++) {
            printf("%s%d", i ? ", " : "", ids[i]);
        }
        printf("]");
        if (llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        const float *l = llama_get_logits_ith(ctx, -1);
        // Top logits by repeated selection (the vocabularies here are small).
        char *taken = calloc(n_vocab, 1);
        printf(", \"top_k\": [");
        for (int k = 0; k < TOP && k < n_vocab; k++) {
            int best = -1;
            for (int i = 0; i < n_vocab; i++) {
                if (!taken[i] && (best < 0 || l[i] > l[best])) {
                    best = i;
                }
            }
            taken[best] = 1;
            printf("%s[%d, %.9g]", k ? ", " : "", best, l[best]);
        }
        free(taken);
        printf("]");
        int greedy[1024];
        float gaps[1024];
        for (int s = 0; s < n_greedy && s < 1024; s++) {
            llama_token t = argmax(l, n_vocab, &gaps[s]);
            greedy[s] = t;
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            l = llama_get_logits_ith(ctx, -1);
        }
        printf(", \"greedy\": [");
        for (int s = 0; s < n_greedy; s++) {
            printf("%s%d", s ? ", " : "", greedy[s]);
        }
        printf("], \"gap\": [");
        for (int s = 0; s < n_greedy; s++) {
            printf("%s%.5g", s ? ", " : "", gaps[s]);
        }
        printf("]}");
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
