// sampler-ref: runs llama.cpp's sampler chain (built through libllama's public API, in
// the order and with the settings common/sampling.cpp uses) over generated logit rows and
// prints the token it picks at each step, with the number of candidates the final draw
// chose from ("token:count ..."). scripts/record-sampler-ref.sh turns this into the
// fixtures tests/data/sampler/*.txt that src/sample's tests replay.
//
// Usage: sampler-ref VOCAB STEPS LSEED SEED ROWS PROMPT [key=value ...]
//   ROWS: mixed | sticky | ties (see row() below; src/sample/reference_tests.rs generates
//   the same rows), PROMPT: comma-separated tokens accepted before the first step, or "-".
//   keys: temp top_k top_p min_p typical_p top_n_sigma xtc_probability xtc_threshold
//   dynatemp_range dynatemp_exponent repeat_penalty repeat_last_n frequency_penalty
//   presence_penalty min_keep logit_bias=TOK:BIAS,... banned=TOK,...
#include "llama.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static uint64_t splitmix(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t mix(uint64_t a, uint64_t b) { return splitmix(a ^ splitmix(b)); }

// Uniform in [-range, range) with 2^23 steps: the top 24 bits of u, centred and scaled
// by a power of two (every operation exact in float).
static float centred(uint64_t u, float step) {
    return (float) ((int64_t) (u >> 40) - 8388608) * step;
}

// One logit row, a function of (lseed, step) only. Kinds: 0 flat [-2,2), 1 spread
// [-8,8), 2 peaked (three tokens 8.5-10 above a (-8,0] floor), 3 ties (16 levels),
// 4 sticky (a per-lseed base row plus small per-step noise), 5 near-greedy (one token
// 30 above a flat row).
static void row(std::vector<float> & out, int n, uint64_t lseed, uint64_t step, const std::string & rows) {
    const uint64_t key = mix(lseed, step);
    int kind;
    if (rows == "sticky") {
        kind = 4;
    } else if (rows == "ties") {
        kind = 3;
    } else {
        kind = (int) (mix(key, 0xFFFFFFFFull) % 6);
    }
    out.resize(n);
    for (int i = 0; i < n; i++) {
        const uint64_t u = mix(key, (uint64_t) i);
        float l;
        switch (kind) {
            case 0: l = centred(u, 1.0f / 4194304.0f); break;
            case 1: l = centred(u, 1.0f / 1048576.0f); break;
            case 2: l = -(float) (u >> 41) * (1.0f / 524288.0f); break;
            case 3: l = (float) (u >> 60) * 0.5f - 4.0f; break;
            case 4: l = centred(mix(lseed, (uint64_t) i), 1.0f / 1048576.0f) + (float) (u >> 56) * (1.0f / 1024.0f); break;
            default: l = centred(u, 1.0f / 4194304.0f); break;
        }
        out[i] = l;
    }
    if (kind == 2) {
        const float peaks[3] = { 10.0f, 9.0f, 8.5f };
        for (int j = 0; j < 3; j++) {
            out[mix(key, 1000000ull + j) % (uint64_t) n] += peaks[j];
        }
    } else if (kind == 5) {
        out[mix(key, 2000000ull) % (uint64_t) n] += 30.0f;
    }
}

static std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size()) {
        size_t end = s.find(sep, at);
        if (end == std::string::npos) {
            end = s.size();
        }
        if (end > at) {
            out.push_back(s.substr(at, end - at));
        }
        at = end + 1;
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s VOCAB STEPS LSEED SEED ROWS PROMPT [key=value ...]\n", argv[0]);
        return 2;
    }
    const int n_vocab = atoi(argv[1]);
    const int steps = atoi(argv[2]);
    const uint64_t lseed = strtoull(argv[3], nullptr, 10);
    const uint32_t seed = (uint32_t) strtoul(argv[4], nullptr, 10);
    const std::string rows = argv[5];
    std::vector<llama_token> prompt;
    if (std::string(argv[6]) != "-") {
        for (const auto & t : split(argv[6], ',')) {
            prompt.push_back(atoi(t.c_str()));
        }
    }

    // common_params_sampling's defaults
    float temp = 0.80f, top_p = 0.95f, min_p = 0.05f, typ_p = 1.0f, top_n_sigma = -1.0f;
    float xtc_p = 0.0f, xtc_t = 0.10f, dyn_range = 0.0f, dyn_exp = 1.0f;
    float pen_repeat = 1.0f, pen_freq = 0.0f, pen_present = 0.0f;
    int32_t top_k = 40, pen_last_n = 64, min_keep = 0;
    std::vector<llama_logit_bias> bias;
    for (int a = 7; a < argc; a++) {
        const std::string kv = argv[a];
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) {
            fprintf(stderr, "bad argument %s\n", kv.c_str());
            return 2;
        }
        const std::string k = kv.substr(0, eq);
        const std::string v = kv.substr(eq + 1);
        const float f = strtof(v.c_str(), nullptr);
        if (k == "temp") temp = f;
        else if (k == "top_k") top_k = atoi(v.c_str());
        else if (k == "top_p") top_p = f;
        else if (k == "min_p") min_p = f;
        else if (k == "typical_p") typ_p = f;
        else if (k == "top_n_sigma") top_n_sigma = f;
        else if (k == "xtc_probability") xtc_p = f;
        else if (k == "xtc_threshold") xtc_t = f;
        else if (k == "dynatemp_range") dyn_range = f;
        else if (k == "dynatemp_exponent") dyn_exp = f;
        else if (k == "repeat_penalty") pen_repeat = f;
        else if (k == "repeat_last_n") pen_last_n = atoi(v.c_str());
        else if (k == "frequency_penalty") pen_freq = f;
        else if (k == "presence_penalty") pen_present = f;
        else if (k == "min_keep") min_keep = atoi(v.c_str());
        else if (k == "logit_bias") {
            for (const auto & p : split(v, ',')) {
                const size_t c = p.find(':');
                bias.push_back({ atoi(p.substr(0, c).c_str()), strtof(p.substr(c + 1).c_str(), nullptr) });
            }
        } else if (k == "banned") {
            // after the user's biases, as common.cpp appends the --ignore-eos ones
            for (const auto & t : split(v, ',')) {
                bias.push_back({ atoi(t.c_str()), -INFINITY });
            }
        } else {
            fprintf(stderr, "unknown key %s\n", k.c_str());
            return 2;
        }
    }
    // Keys that apply after all others (banned) must follow logit_bias on the command
    // line; record-sampler-ref.sh writes them in that order.

    // The chain common_sampler_init builds (no grammar, mirostat 0, the default sampler
    // order: penalties, dry (off), top-n-sigma, top-k, typical, top-p, min-p, xtc,
    // temperature), then dist.
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (!bias.empty()) {
        llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, (int32_t) bias.size(), bias.data()));
    }
    llama_sampler_chain_add(chain, llama_sampler_init_penalties(n_vocab, pen_last_n, pen_repeat, pen_freq, pen_present));
    llama_sampler_chain_add(chain, llama_sampler_init_top_n_sigma(top_n_sigma));
    llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k));
    llama_sampler_chain_add(chain, llama_sampler_init_typical(typ_p, min_keep));
    llama_sampler_chain_add(chain, llama_sampler_init_top_p(top_p, min_keep));
    llama_sampler_chain_add(chain, llama_sampler_init_min_p(min_p, min_keep));
    llama_sampler_chain_add(chain, llama_sampler_init_xtc(xtc_p, xtc_t, min_keep, seed));
    llama_sampler_chain_add(chain, llama_sampler_init_temp_ext(temp, dyn_range, dyn_exp));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));

    for (llama_token t : prompt) {
        llama_sampler_accept(chain, t);
    }

    std::vector<float> logits;
    std::vector<llama_token_data> cur;
    for (int s = 0; s < steps; s++) {
        row(logits, n_vocab, lseed, (uint64_t) s, rows);
        cur.resize(n_vocab);
        for (int i = 0; i < n_vocab; i++) {
            cur[i] = llama_token_data{ i, logits[i], 0.0f };
        }
        llama_token_data_array arr = { cur.data(), cur.size(), -1, false };
        llama_sampler_apply(chain, &arr);
        if (arr.selected < 0) {
            fprintf(stderr, "step %d: nothing selected\n", s);
            return 1;
        }
        const llama_token tok = arr.data[arr.selected].id;
        llama_sampler_accept(chain, tok);
        printf("%s%d:%zu", s ? " " : "", tok, arr.size);
    }
    printf("\n");
    llama_sampler_free(chain);
    return 0;
}
