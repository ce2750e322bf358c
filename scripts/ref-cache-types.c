/* LD_PRELOAD shim for the llama.cpp reference tools (refshift, refdump): sets the K/V
 * cache types and flash attention of every context they create from the environment,
 * so their recordings can be made with -ctk/-ctv/-fa as llama-perplexity takes them.
 *
 *   REF_TYPE_K, REF_TYPE_V: ggml type ids (f16 1, q4_0 2, q4_1 3, q5_0 6, q5_1 7,
 *   q8_0 8, iq4_nl 20, bf16 30); REF_FLASH_ATTN: -1 auto, 0 off, 1 on.
 *
 * Built and preloaded by scripts/record-kv-types-ref.sh; by hand:
 *   cc -shared -fPIC -O2 -I SRC/include -I SRC/ggml/include ref-cache-types.c -o shim.so -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include "llama.h"

typedef struct llama_context *(*init_fn)(struct llama_model *, struct llama_context_params);

struct llama_context *llama_init_from_model(struct llama_model *model,
                                            struct llama_context_params params) {
    const char *k = getenv("REF_TYPE_K"), *v = getenv("REF_TYPE_V");
    const char *fa = getenv("REF_FLASH_ATTN");
    if (k) params.type_k = (enum ggml_type) atoi(k);
    if (v) params.type_v = (enum ggml_type) atoi(v);
    if (fa) params.flash_attn_type = (enum llama_flash_attn_type) atoi(fa);
    init_fn real = (init_fn) dlsym(RTLD_NEXT, "llama_init_from_model");
    return real(model, params);
}
