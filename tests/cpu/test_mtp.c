/* The MTP head in the CPU oracle (cpu_mtp_forward, docs/model.md §3.2) against the independent
 * numpy reference of tools/make_mtp_fixture.py (tests/data/tiny-mtp: tiny-a's trunk, a random
 * head in its own shard with per-expert experts; transformers has no MTP forward to compare
 * with, it ignores mtp.* on load).
 *
 * Tolerance: the reference runs in float64 on the same bf16 weights, the oracle in fp32 with
 * double dot products; measured max |logit diff| 9.5e-7 (logits of magnitude <= 7.5), max |h'
 * diff| 4.8e-7; on the oracle's own trunk hidden (6.7e-6 from HF's) 1.0e-5. We allow 1e-4: 10x
 * the largest measured spread, 1000x below the smallest top-1/top-2
 * margin of the rows (0.11), while a real error (fc halves swapped, a norm without its +1, RoPE
 * at the wrong position, the hidden not normed) moves logits by > 1e-2.
 * The MTP input itself: the oracle's final-normed trunk hidden (cpu_forward_h) against HF's
 * (tiny-a's ref `hidden[L]`), within the 1e-4 the trunk logits already meet. */
#include <stdint.h>
#include "common/util.h"
#include "tulip.h"
#include "cpu/cpu.h"
#include "model/st.h"
#include "model/weights.h"
#include "t_check.h"

#define DIR  "tests/data/tiny-mtp"
#define ATOL 1e-4

static const tl_tensor *ref_get(tl_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    tl_model *m;
    tl_st_file ref, tref;
    const int32_t *tokens, *chain_tok, *prompt;
    const float *hidden, *h_out, *logits, *chain_lg;
    int T, K, D, V;
} mfx;

static int mfx_open(mfx *f) {
    char err[512];
    memset(f, 0, sizeof *f);
    if (tl_model_open(&f->m, DIR, err, sizeof err) ||
        tl_st_open(&f->ref, DIR "/mtp_ref.safetensors", err, sizeof err) ||
        tl_st_open(&f->tref, "tests/data/tiny-a/ref.safetensors", err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    const tl_tensor *t = ref_get(&f->ref, "tokens"), *h = ref_get(&f->ref, "hidden"),
                    *ho = ref_get(&f->ref, "h_out"), *lg = ref_get(&f->ref, "logits"),
                    *ct = ref_get(&f->ref, "chain_tokens"), *cl = ref_get(&f->ref, "chain_logits"),
                    *pr = ref_get(&f->tref, "prompt_ids");
    if (!t || !h || !ho || !lg || !ct || !cl || !pr) return -1;
    f->tokens = t->data, f->hidden = h->data, f->h_out = ho->data, f->logits = lg->data;
    f->chain_tok = ct->data, f->chain_lg = cl->data, f->prompt = pr->data;
    f->T = (int)t->shape[0], f->K = (int)ct->shape[0];
    f->D = f->m->cfg.n_embd, f->V = f->m->cfg.n_vocab;
    return f->m->has_mtp && (int)pr->shape[0] == f->T ? 0 : -1;
}

static void mfx_close(mfx *f) {
    tl_st_close(&f->ref);
    tl_st_close(&f->tref);
    tl_model_close(f->m);
}

/* All rows in one call, then the chain of draft steps, vs the reference. */
static void test_mtp_vs_reference(void) {
    mfx f;
    CHECK(mfx_open(&f) == 0);
    if (!f.m || !f.m->has_mtp) return mfx_close(&f);
    cpu_mtp_state s;
    CHECK_EQ_INT(cpu_mtp_state_init(&s, &f.m->cfg, 64), 0);
    float *h = xmalloc(sizeof(float) * (size_t)f.T * f.D);
    float *lg = xmalloc(sizeof(float) * (size_t)f.T * f.V);
    CHECK_EQ_INT(cpu_mtp_forward(f.m, &s, f.tokens, f.hidden, f.T, 0, h, NULL, lg), 0);
    double dh = max_diff(h, f.h_out, (size_t)f.T * f.D);
    double dl = max_diff(lg, f.logits, (size_t)f.T * f.V);
    printf("# rows: max |h' - ref| %.2g, max |logit - ref| %.2g\n", dh, dl);
    CHECK(dh < ATOL);
    CHECK(dl < ATOL);
    /* the chain: argmax of the last logits, fed with that row's h', one position on */
    const float *hp = h + (size_t)(f.T - 1) * f.D;
    int tok = argmax(lg + (size_t)(f.T - 1) * f.V, f.V);
    float *h2 = xmalloc(sizeof(float) * f.D), *l2 = xmalloc(sizeof(float) * f.V);
    float *hcur = xmalloc(sizeof(float) * f.D);
    memcpy(hcur, hp, sizeof(float) * f.D);
    double dc = 0;
    for (int i = 0; i < f.K; i++) {
        CHECK_EQ_INT(tok, f.chain_tok[i]);
        CHECK_EQ_INT(cpu_mtp_forward(f.m, &s, &tok, hcur, 1, f.T + i, h2, l2, NULL), 0);
        dc = fmax(dc, max_diff(l2, f.chain_lg + (size_t)i * f.V, f.V));
        memcpy(hcur, h2, sizeof(float) * f.D);
        tok = argmax(l2, f.V);
    }
    printf("# chain of %d: max |logit - ref| %.2g\n", f.K, dc);
    CHECK(dc < ATOL);
    free(h), free(lg), free(h2), free(l2), free(hcur);
    cpu_mtp_state_free(&s);
    mfx_close(&f);
}

/* Row by row (as the engine drafts) gives bit for bit what one call over all rows gives. */
static void test_mtp_rows_equal_batch(void) {
    mfx f;
    CHECK(mfx_open(&f) == 0);
    if (!f.m || !f.m->has_mtp) return mfx_close(&f);
    cpu_mtp_state a, b;
    CHECK_EQ_INT(cpu_mtp_state_init(&a, &f.m->cfg, 64), 0);
    CHECK_EQ_INT(cpu_mtp_state_init(&b, &f.m->cfg, 64), 0);
    float *lg = xmalloc(sizeof(float) * (size_t)f.T * f.V), *l1 = xmalloc(sizeof(float) * f.V);
    float *h = xmalloc(sizeof(float) * (size_t)f.T * f.D), *h1 = xmalloc(sizeof(float) * f.D);
    CHECK_EQ_INT(cpu_mtp_forward(f.m, &a, f.tokens, f.hidden, f.T, 0, h, NULL, lg), 0);
    int same = 1;
    for (int p = 0; p < f.T; p++) {
        CHECK_EQ_INT(
            cpu_mtp_forward(f.m, &b, f.tokens + p, f.hidden + (size_t)p * f.D, 1, p, h1, l1, NULL),
            0);
        same &= !memcmp(l1, lg + (size_t)p * f.V, sizeof(float) * f.V);
        same &= !memcmp(h1, h + (size_t)p * f.D, sizeof(float) * f.D);
    }
    CHECK(same);
    /* errors: a bad token, past the cache */
    int32_t bad = f.V;
    CHECK_EQ_INT(cpu_mtp_forward(f.m, &b, &bad, f.hidden, 1, 0, NULL, l1, NULL), TL_ERR_INVALID);
    CHECK_EQ_INT(cpu_mtp_forward(f.m, &b, f.tokens, f.hidden, 1, 64, NULL, l1, NULL),
                 TL_ERR_CONTEXT_FULL);
    free(lg), free(l1), free(h), free(h1);
    cpu_mtp_state_free(&a);
    cpu_mtp_state_free(&b);
    mfx_close(&f);
}

/* The head's input: the oracle's final-normed trunk hidden equals HF's (tiny-a ref hidden[L]),
 * and the head on the oracle's own hidden stays within the tolerance of the reference. */
static void test_mtp_input_is_final_normed_hidden(void) {
    mfx f;
    CHECK(mfx_open(&f) == 0);
    if (!f.m || !f.m->has_mtp) return mfx_close(&f);
    cpu_state st;
    CHECK_EQ_INT(cpu_state_init(&st, &f.m->cfg, 64), 0);
    float *hid = xmalloc(sizeof(float) * (size_t)f.T * f.D);
    CHECK_EQ_INT(cpu_forward_h(f.m, &st, f.prompt, f.T, NULL, NULL, hid), 0);
    double dh = max_diff(hid, f.hidden, (size_t)f.T * f.D);
    printf("# trunk final hidden vs HF: max diff %.2g\n", dh);
    CHECK(dh < ATOL);
    cpu_mtp_state s;
    CHECK_EQ_INT(cpu_mtp_state_init(&s, &f.m->cfg, 64), 0);
    float *lg = xmalloc(sizeof(float) * (size_t)f.T * f.V);
    CHECK_EQ_INT(cpu_mtp_forward(f.m, &s, f.tokens, hid, f.T, 0, NULL, NULL, lg), 0);
    double dl = max_diff(lg, f.logits, (size_t)f.T * f.V);
    printf("# head on the oracle's hidden: max |logit - ref| %.2g\n", dl);
    CHECK(dl < ATOL);
    free(hid), free(lg);
    cpu_mtp_state_free(&s);
    cpu_state_free(&st);
    mfx_close(&f);
}

int main(void) {
    T_RUN(test_mtp_vs_reference);
    T_RUN(test_mtp_rows_equal_batch);
    T_RUN(test_mtp_input_is_final_normed_hidden);
    return t_summary();
}
