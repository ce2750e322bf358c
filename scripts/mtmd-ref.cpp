// llama.cpp's reference for an image in a prompt, through libmtmd as llama-mtmd-cli runs
// it: the prompt (text with <__media__> markers) tokenized into chunks, evaluated with
// mtmd's helper (an image decoded in one non-causal batch where the model asks for it),
// then a greedy continuation with each step's margin (best logit less the runner-up).
// Prints JSON: the chunks (text token ids, or an image's token count), the top 5 logits
// after the prompt, the greedy ids, their pieces and margins. With MTMD_REF_EMBD set, also
// writes every image chunk's embeddings (all tiles of a tiled image) to that file.
// Usage: mtmd-ref MODEL MMPROJ IMAGE PROMPT_FILE N_PREDICT   (flash attention off)
// Built by scripts/record-vision-ref.sh against ../shared/tools/llamacpp-ref's build.
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            default:
                if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
                else o += (char) c;
        }
    }
    return o + "\"";
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: mtmd-ref MODEL MMPROJ IMAGE PROMPT_FILE N_PREDICT\n");
        return 1;
    }
    std::ifstream pf(argv[4]);
    std::stringstream prompt_ss;
    prompt_ss << pf.rdbuf();
    const std::string prompt = prompt_ss.str();
    const int n_predict = atoi(argv[5]);

    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    mtmd_helper_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mparams = llama_model_default_params();
    // MTMD_REF_NGL: the language model's layers on llama.cpp's GPU backend (Vulkan on
    // lavapipe needs GGML_VK_VISIBLE_DEVICES=0); the encoder stays on the CPU.
    mparams.n_gpu_layers = getenv("MTMD_REF_NGL") ? atoi(getenv("MTMD_REF_NGL")) : 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    auto cparams = llama_context_default_params();
    cparams.n_ctx = 1024;
    cparams.n_batch = 512;
    cparams.n_ubatch = 512;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * lctx = llama_init_from_model(model, cparams);

    auto vparams = mtmd_context_params_default();
    vparams.use_gpu = false;
    vparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    vparams.warmup = false;
    mtmd_context * vctx = mtmd_init_from_file(argv[2], model, vparams);
    if (!vctx) { fprintf(stderr, "cannot load %s\n", argv[2]); return 1; }
    auto img = mtmd_helper_bitmap_init_from_file(vctx, argv[3], false, mtmd_helper_init_opt_default());
    if (!img.bitmap) { fprintf(stderr, "cannot read %s\n", argv[3]); return 1; }

    mtmd_input_text text = { prompt.c_str(), prompt.size(), true, true };
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    const mtmd_bitmap * bitmaps[1] = { img.bitmap };
    if (mtmd_tokenize(vctx, chunks, &text, bitmaps, 1) != 0) { fprintf(stderr, "tokenize failed\n"); return 1; }

    std::string out = "{\"chunks\": [";
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        out += i ? ", " : "";
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * t = mtmd_input_chunk_get_tokens_text(c, &n);
            out += "{\"text\": [";
            for (size_t j = 0; j < n; j++) out += (j ? ", " : "") + std::to_string(t[j]);
            out += "]}";
        } else {
            out += "{\"image\": " + std::to_string(mtmd_input_chunk_get_n_tokens(c)) +
                   ", \"non_causal\": " + (mtmd_decode_use_non_causal(vctx, c) ? "true" : "false") + "}";
        }
    }
    out += "]";

    // MTMD_REF_EMBD=FILE: every image chunk's embeddings, in prompt order, written as
    // llama.cpp's MTMD_DEBUG_EMBEDDINGS dump (i32 tokens, i32 width, f32 rows).
    if (const char * dump = getenv("MTMD_REF_EMBD")) {
        const int n_embd = llama_model_n_embd(model);
        std::vector<float> all;
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
            const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
            if (mtmd_input_chunk_get_type(c) != MTMD_INPUT_CHUNK_TYPE_IMAGE) continue;
            if (mtmd_encode_chunk(vctx, c) != 0) { fprintf(stderr, "encode failed\n"); return 1; }
            const float * e = mtmd_get_output_embd(vctx);
            all.insert(all.end(), e, e + (size_t) n_embd * mtmd_input_chunk_get_n_tokens(c));
        }
        FILE * f = fopen(dump, "wb");
        if (!f) { fprintf(stderr, "cannot write %s\n", dump); return 1; }
        const int32_t hdr[2] = { (int32_t) (all.size() / n_embd), n_embd };
        fwrite(hdr, sizeof hdr, 1, f);
        fwrite(all.data(), sizeof(float), all.size(), f);
        fclose(f);
    }

    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(vctx, lctx, chunks, 0, 0, 512, true, &n_past) != 0) {
        fprintf(stderr, "eval failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<int> ids, order(n_vocab);
    std::vector<float> margins;
    std::string pieces = "[";
    for (int step = 0; step < n_predict; step++) {
        const float * l = llama_get_logits_ith(lctx, -1);
        for (int i = 0; i < n_vocab; i++) order[i] = i;
        std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                          [&](int a, int b) { return l[a] > l[b]; });
        if (step == 0) {
            out += ", \"top5\": [";
            for (int k = 0; k < 5; k++) {
                char b[64];
                snprintf(b, sizeof b, "%s[%d, %.6f]", k ? ", " : "", order[k], l[order[k]]);
                out += b;
            }
            out += "]";
        }
        const int tok = order[0];
        ids.push_back(tok);
        margins.push_back(l[order[0]] - l[order[1]]);
        char piece[256];
        const int n = llama_token_to_piece(vocab, tok, piece, sizeof piece, 0, true);
        pieces += (step ? ", " : "") + json_str(std::string(piece, std::max(n, 0)));
        llama_batch b = llama_batch_get_one(&ids.back(), 1);
        if (llama_decode(lctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    out += ", \"n_past\": " + std::to_string(n_past) + ", \"greedy\": [";
    for (size_t i = 0; i < ids.size(); i++) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "], \"margins\": [";
    for (size_t i = 0; i < margins.size(); i++) {
        char b[32];
        snprintf(b, sizeof b, "%s%.5f", i ? ", " : "", margins[i]);
        out += b;
    }
    out += "], \"pieces\": " + pieces + "]}\n";
    fputs(out.c_str(), stdout);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(img.bitmap);
    mtmd_free(vctx);
    llama_free(lctx);
    llama_model_free(model);
    return 0;
}
