/* The host sampler (src/engine/sample.c), the reference the CUDA sampler is compared with,
 * against a straightforward double-precision implementation written here from the definitions:
 *   penalties   repetition (HF/vLLM: over prompt and generated tokens, once per distinct token,
 *               l > 0 ? l / r : l * r), then presence and frequency (OpenAI: over generated
 *               tokens only, l -= presence + frequency * count);
 *   greedy      argmax of the penalised logits, lowest id on ties;
 *   sampling    softmax(l / T); min-p keeps p >= min_p * p_max; top-k keeps the k most likely;
 *               top-p keeps, of those, the smallest most-likely-first set whose mass is at least
 *               top_p of theirs (renormalised, as vLLM and the CUDA kernel do); draw from the
 *               survivors renormalised;
 *   logprobs    log-softmax of the unmodified logits: the token's and the n largest (lowest id
 *               first on ties);
 *   restrictions (tulip.h) before the penalties: the logit bias added (a repeated id: the sum of
 *               its values), tokens outside the allowed bitset at -inf; nothing finite left:
 *               token -2 and no draw.
 * Distributions are checked over many seeds (one draw per seed, as a request's first token):
 * no token outside the reference's candidate set, and a chi-square bound on the counts inside it
 * that a candidate set off by one token, or a wrong temperature or penalty, cannot pass. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "common/util.h"
#include "engine/sample.h"
#include "t_check.h"

/* ====== The reference. ====== */

typedef struct {
    const int32_t *hist;
    int n_hist, n_prompt;
} history;

static void ref_penalised(const float *logits, int V, const tl_sample_params *p, history h,
                          double *l) {
    for (int t = 0; t < V; t++) {
        int in_hist = 0, gen = 0;
        for (int i = 0; i < h.n_hist; i++)
            if (h.hist[i] == t) {
                in_hist = 1;
                gen += i >= h.n_prompt;
            }
        double x = logits[t];
        for (int j = 0; j < p->n_bias; j++) x += p->bias_ids[j] == t ? p->bias_vals[j] : 0;
        if (p->allow && !(p->allow[t / 32] & (1u << (t % 32)))) x = -INFINITY;
        if (in_hist) x = x > 0 ? x / p->repetition_penalty : x * p->repetition_penalty;
        if (gen) x -= p->presence_penalty + p->frequency_penalty * gen;
        l[t] = x;
    }
}

static int ref_argmax(const double *l, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* Number of tokens ranked before i (more likely, or as likely with a lower id). */
static int ref_rank(const double *q, int V, int i) {
    int r = 0;
    for (int j = 0; j < V; j++) r += q[j] > q[i] || (q[j] == q[i] && j < i);
    return r;
}

/* The distribution a draw follows: q[V], zero outside the candidate set, summing to 1. */
static void ref_distribution(const float *logits, int V, const tl_sample_params *p, history h,
                             double *q) {
    double *l = xmalloc(sizeof(double) * V), mx = -INFINITY, z = 0, pmax = 0;
    ref_penalised(logits, V, p, h, l);
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i] / p->temperature);
    for (int i = 0; i < V; i++) z += q[i] = exp(l[i] / p->temperature - mx);
    for (int i = 0; i < V; i++) pmax = fmax(pmax, q[i] /= z);
    int *keep = xmalloc(sizeof(int) * V);
    for (int i = 0; i < V; i++)
        keep[i] = (p->top_k <= 0 || ref_rank(q, V, i) < p->top_k) && q[i] >= p->min_p * pmax;
    if (p->top_p < 1) {
        double kept = 0;
        for (int i = 0; i < V; i++) kept += keep[i] ? q[i] : 0;
        for (int i = 0; i < V; i++) { /* out when the ones before it already reach the mass */
            double before = 0;
            for (int j = 0; j < V && keep[i]; j++)
                if (keep[j] && ref_rank(q, V, j) < ref_rank(q, V, i)) before += q[j];
            if (keep[i] && before >= p->top_p * kept) keep[i] = -1;
        }
    }
    z = 0;
    for (int i = 0; i < V; i++) z += q[i] = keep[i] > 0 ? q[i] : 0;
    for (int i = 0; i < V; i++) q[i] /= z;
    free(keep);
    free(l);
}

/* ====== Distributions over many seeds. ====== */

enum { DRAWS = 100000 };

/* Counts DRAWS first draws (seeds 1..DRAWS) and compares them with the reference. Returns the
 * number of candidates. */
static int check_distribution(const char *name, const float *logits, int V,
                              const tl_sample_params *p, history h) {
    double *q = xmalloc(sizeof(double) * V);
    int *cnt = xcalloc((size_t)V, sizeof(int));
    ref_distribution(logits, V, p, h, q);
    tl_sample_params ps = *p;
    for (int s = 1; s <= DRAWS; s++) {
        uint64_t rng = tl_rng_seed((uint64_t)s * 7919);
        tl_sample_out o;
        CHECK_EQ_INT(tl_sample_host(logits, V, &ps, &rng, h.hist, h.n_hist, h.n_prompt, &o), 0);
        CHECK(o.token >= 0 && o.token < V);
        if (o.token >= 0 && o.token < V) cnt[o.token]++;
    }
    int k = 0, outside = 0;
    double chi2 = 0;
    for (int i = 0; i < V; i++) {
        if (q[i] == 0) {
            outside += cnt[i];
            continue;
        }
        k++;
        double want = q[i] * DRAWS;
        chi2 += (cnt[i] - want) * (cnt[i] - want) / want;
    }
    /* chi-square with k-1 degrees of freedom, bound at its upper 3e-7 quantile (Wilson-Hilferty:
     * z = 5). The seeds are fixed, so a pass or fail repeats; a token missing from the set adds
     * about its expected count (>= 400 here), a temperature 5% off 100 or more. */
    double df = k > 1 ? k - 1 : 1, a = 2 / (9 * df), c3 = 1 - a + 5 * sqrt(a);
    double bound = df * c3 * c3 * c3;
    printf("# %-22s %2d candidates, chi2 %6.1f (bound %.0f), %d draws outside\n", name, k, chi2,
           bound, outside);
    CHECK_EQ_INT(outside, 0);
    CHECK(chi2 < bound);
    free(q);
    free(cnt);
    return k;
}

static const float L12[12] = {2.0f,  1.2f, 0.9f,  0.7f, 0.5f,  0.1f,
                              -0.3f, 1.6f, -1.0f, 0.3f, -2.0f, 1.0f};

static tl_sample_params sp(float t, int k, float top_p, float min_p) {
    return (tl_sample_params){
        .temperature = t, .top_k = k, .top_p = top_p, .min_p = min_p, .repetition_penalty = 1};
}

static void test_distribution_filters(void) {
    history none = {0};
    tl_sample_params p = sp(1, 0, 1, 0);
    CHECK_EQ_INT(check_distribution("T=1", L12, 12, &p, none), 12);
    p = sp(0.5f, 0, 1, 0);
    CHECK_EQ_INT(check_distribution("T=0.5", L12, 12, &p, none), 12);
    p = sp(1.7f, 0, 1, 0);
    CHECK_EQ_INT(check_distribution("T=1.7", L12, 12, &p, none), 12);
    p = sp(1, 4, 1, 0);
    CHECK_EQ_INT(check_distribution("top_k=4", L12, 12, &p, none), 4);
    p = sp(1, 0, 0.5f, 0);
    check_distribution("top_p=0.5", L12, 12, &p, none);
    p = sp(1, 0, 1, 0.3f);
    check_distribution("min_p=0.3", L12, 12, &p, none);
    /* top-p over the top-k survivors, renormalised: with k=5 the 5 hold ~0.74 of the mass, so
     * 0.8 of that is reached by 4 tokens (of the whole vocabulary's mass it never would be) */
    p = sp(1, 5, 0.8f, 0);
    CHECK_EQ_INT(check_distribution("top_k=5,top_p=0.8", L12, 12, &p, none), 4);
    p = sp(0.8f, 6, 0.9f, 0.1f);
    check_distribution("T0.8,k6,p0.9,min_p0.1", L12, 12, &p, none);
}

/* top-p at each boundary of the cumulative mass: just below it keeps k tokens, just above
 * k + 1 (the reference says how many; the counts say which). */
static void test_top_p_boundaries(void) {
    history none = {0};
    double q[12];
    tl_sample_params p = sp(1, 0, 1, 0);
    ref_distribution(L12, 12, &p, none, q);
    double sorted[12], cum = 0;
    memcpy(sorted, q, sizeof sorted);
    for (int i = 0; i < 12; i++) /* descending */
        for (int j = i + 1; j < 12; j++)
            if (sorted[j] > sorted[i]) {
                double t = sorted[i];
                sorted[i] = sorted[j], sorted[j] = t;
            }
    for (int k = 1; k <= 4; k++) {
        cum += sorted[k - 1];
        char name[64];
        p.top_p = (float)(cum - 1e-4);
        snprintf(name, sizeof name, "top_p=%.4f", (double)p.top_p);
        CHECK_EQ_INT(check_distribution(name, L12, 12, &p, none), k);
        p.top_p = (float)(cum + 1e-4);
        snprintf(name, sizeof name, "top_p=%.4f", (double)p.top_p);
        CHECK_EQ_INT(check_distribution(name, L12, 12, &p, none), k + 1);
    }
}

static void test_distribution_penalties(void) {
    /* prompt: tokens 0, 7, 3 (7 twice); generated: 1 three times, 11 once, 0 once */
    static const int32_t h[] = {0, 7, 3, 7, 1, 11, 1, 0, 1};
    history hist = {h, 9, 4};
    tl_sample_params p = sp(1, 0, 1, 0);
    p.repetition_penalty = 1.4f;
    check_distribution("repetition 1.4", L12, 12, &p, hist);
    p = sp(1, 0, 1, 0);
    p.presence_penalty = 0.8f;
    check_distribution("presence 0.8", L12, 12, &p, hist);
    p = sp(1, 0, 1, 0);
    p.frequency_penalty = 0.5f;
    check_distribution("frequency 0.5", L12, 12, &p, hist);
    p = sp(0.7f, 0, 0.9f, 0);
    p.repetition_penalty = 1.2f, p.presence_penalty = -0.5f, p.frequency_penalty = 0.25f;
    check_distribution("all, T0.7, p0.9", L12, 12, &p, hist);
}

/* ====== Greedy. ====== */

static int host_token(const float *l, int V, const tl_sample_params *p, history h) {
    tl_sample_out o;
    uint64_t rng = tl_rng_seed(1);
    CHECK_EQ_INT(tl_sample_host(l, V, p, &rng, h.hist, h.n_hist, h.n_prompt, &o), 0);
    return o.token;
}

/* Hand cases, each with the token the definitions give (and the reference must agree). */
static void test_greedy_penalty_cases(void) {
    static const int32_t prompt0[] = {0}, prompt0x5[] = {0, 0, 0, 0, 0}, gen0[] = {5, 0},
                         gen0x2[] = {5, 0, 0}, gen0x3[] = {5, 0, 0, 0};
    struct {
        float l0, l1, rep, pres, freq;
        history h;
        int want;
    } c[] = {
        {2.0f, 1.5f, 1.5f, 0, 0, {prompt0, 1, 1}, 1},   /* 2/1.5 = 1.33 < 1.5 */
        {2.0f, 1.5f, 1.2f, 0, 0, {prompt0, 1, 1}, 0},   /* 1.67 > 1.5 */
        {-1.0f, -1.2f, 1.5f, 0, 0, {prompt0, 1, 1}, 1}, /* negative: -1.5 < -1.2 */
        {2.0f, 1.3f, 1.5f, 0, 0, {prompt0x5, 5, 5}, 0}, /* once per token, not per use */
        {2.0f, 1.9f, 1, 1.0f, 0, {prompt0, 1, 1}, 0},   /* presence: prompt tokens exempt */
        {2.0f, 1.9f, 1, 1.0f, 0, {gen0, 2, 1}, 1},      /* generated once: 1.0 < 1.9 */
        {3.0f, 2.2f, 1, 0, 0.3f, {gen0x3, 4, 1}, 1},    /* frequency x3: 2.1 < 2.2 */
        {3.0f, 2.2f, 1, 0, 0.3f, {gen0x2, 3, 1}, 0},    /* frequency x2: 2.4 > 2.2 */
        {1.0f, 1.0f, 1, 0, 0, {NULL, 0, 0}, 0},         /* tie: lowest id */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        float l[8] = {c[i].l0, c[i].l1, -5, -5, -5, -5, -5, -5};
        tl_sample_params p = sp(0, 0, 1, 0);
        p.repetition_penalty = c[i].rep, p.presence_penalty = c[i].pres;
        p.frequency_penalty = c[i].freq;
        double pl[8];
        ref_penalised(l, 8, &p, c[i].h, pl);
        CHECK_EQ_INT(ref_argmax(pl, 8), c[i].want);
        int got = host_token(l, 8, &p, c[i].h);
        if (got != c[i].want) fprintf(stderr, "  greedy case %zu: %d\n", i, got);
        CHECK_EQ_INT(got, c[i].want);
    }
}

static void test_greedy_random(void) {
    enum { V = 4000, TRIALS = 60 };
    uint64_t rs = 12345;
    float *l = xmalloc(sizeof(float) * (V + 1));
    double *pl = xmalloc(sizeof(double) * V);
    int32_t hist[64];
    int checked = 0;
    for (int t = 0; t < TRIALS; t++) {
        for (int i = 0; i < V; i++) l[i] = (float)(4 * tl_rng_uniform(&rs) - 2);
        l[V] = 100; /* past n_vocab: never a candidate */
        int nh = 16 + t % 40;
        for (int i = 0; i < nh; i++) hist[i] = (int32_t)(tl_rng_uniform(&rs) * 60); /* repeats */
        history h = {hist, nh, nh / 2};
        tl_sample_params p = sp(t % 3 ? 0 : -1, 0, 1, 0);
        p.repetition_penalty = 1 + (float)(t % 5) * 0.2f, p.presence_penalty = (t % 4) * 0.3f;
        p.frequency_penalty = (t % 3) * 0.2f;
        for (int i = 0; i < 8; i++) l[hist[i]] = 2.1f + 0.01f * i; /* the leaders are in it */
        ref_penalised(l, V, &p, h, pl);
        int want = ref_argmax(pl, V);
        double second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != want) second = fmax(second, pl[i]);
        if (pl[want] - second < 1e-4) continue; /* float rounding could order a near-tie */
        checked++;
        CHECK_EQ_INT(host_token(l, V, &p, h), want);
    }
    CHECK(checked > TRIALS / 2);
    free(l);
    free(pl);
}

/* ====== Logprobs. ====== */

static void test_logprobs(void) {
    enum { V = 3000 };
    uint64_t rs = 777;
    float *l = xmalloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = (float)(6 * tl_rng_uniform(&rs) - 3);
    l[10] = l[20] = 5.0f; /* a tie at the top: 10 first */
    l[30] = 4.5f;
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) z += exp(l[i] - mx);
    double lse = mx + log(z);
    static const int32_t h[] = {10, 20, 30};
    /* sampling with everything on: the logprobs still describe the unmodified logits */
    tl_sample_params p = sp(0.6f, 50, 0.9f, 0.05f);
    p.repetition_penalty = 1.3f, p.presence_penalty = 0.7f, p.frequency_penalty = 0.4f;
    for (int n = 0; n <= TL_MAX_LOGPROBS; n += 5) {
        p.n_logprobs = n;
        tl_sample_out o;
        uint64_t rng = tl_rng_seed((uint64_t)n + 1);
        CHECK_EQ_INT(tl_sample_host(l, V, &p, &rng, h, 3, 1, &o), 0);
        CHECK_CLOSE(o.logprob, l[o.token] - lse, 1e-5, 1e-6);
        CHECK_EQ_INT(o.n_top, n);
        int prev = -1;
        for (int r = 0; r < o.n_top; r++) {
            /* rank r: exactly r tokens come before it (larger, or equal with a lower id) */
            int id = o.top_ids[r], before = 0;
            for (int j = 0; j < V; j++) before += l[j] > l[id] || (l[j] == l[id] && j < id);
            CHECK_EQ_INT(before, r);
            CHECK(id != prev);
            CHECK_CLOSE(o.top_logprobs[r], l[id] - lse, 1e-5, 1e-6);
            prev = id;
        }
        if (n >= 3) CHECK(o.top_ids[0] == 10 && o.top_ids[1] == 20 && o.top_ids[2] == 30);
    }
    free(l);
}

/* Logits with a NaN or +inf, or only -inf ones, have no distribution: token -1 and no draw,
 * greedy or sampled, as the device sampler does (tulip.h: tl_sample_out). A -inf among finite
 * logits is a probability of 0: that token is never drawn. */
static void test_non_finite(void) {
    enum { V = 64 };
    float l[V];
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++)
        for (int temp = 0; temp < 2; temp++) {
            for (int i = 0; i < V; i++) l[i] = (float)((i * 7) % 13) * 0.25f;
            if (k < 2)
                l[(k * 17 + 5) % V] = bad[k];
            else
                for (int i = 0; i < V; i++) l[i] = -INFINITY;
            tl_sample_params p = {
                .temperature = temp ? 1.0f : 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
            uint64_t rng = 99, rng0 = rng;
            tl_sample_out o;
            CHECK_EQ_INT(tl_sample_host(l, V, &p, &rng, NULL, 0, 0, &o), 0);
            CHECK_EQ_INT(o.token, -1);
            CHECK(rng == rng0); /* nothing drawn */
        }
    for (int temp = 0; temp < 2; temp++)
        for (int seed = 1; seed <= 50; seed++) {
            for (int i = 0; i < V; i++) l[i] = (float)((i * 7) % 13) * 0.25f;
            l[12] = -INFINITY; /* 12 * 7 % 13 = 6: not the greedy pick, so greedy must not fail */
            tl_sample_params p = {
                .temperature = temp ? 1.0f : 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
            uint64_t rng = (uint64_t)seed;
            tl_sample_out o;
            CHECK_EQ_INT(tl_sample_host(l, V, &p, &rng, NULL, 0, 0, &o), 0);
            CHECK(o.token >= 0 && o.token < V && o.token != 12);
        }
}

/* ====== Token restrictions: logit bias and the allowed-token mask. ====== */

static void set_allow(uint32_t *bits, int n_words, const int *ids, int n) {
    memset(bits, 0, sizeof(uint32_t) * n_words);
    for (int i = 0; i < n; i++) bits[ids[i] / 32] |= 1u << (ids[i] % 32);
}

/* Hand-worked greedy cases on L12 (2.0 at 0, 1.6 at 7, 1.2 at 1, 1.0 at 11, 0.9 at 2, 0.7 at 3,
 * 0.5 at 4, 0.3 at 9, 0.1 at 5, ...). */
static void test_restrict_greedy_cases(void) {
    static const int32_t gen3[] = {0, 3}; /* prompt 0, generated 3 */
    struct {
        int n_bias;
        int32_t ids[3];
        float vals[3];
        int n_allow; /* -1: no mask */
        int allow[4];
        float presence;
        int want;
    } c[] = {
        {1, {1}, {1.0f}, -1, {0}, 0, 1},               /* 1.2 + 1 = 2.2 > 2.0 */
        {1, {1}, {0.7f}, -1, {0}, 0, 0},               /* 1.9 < 2.0 */
        {1, {0}, {-100.0f}, -1, {0}, 0, 7},            /* 0 banned: 7 (1.6) next */
        {0, {0}, {0}, 3, {3, 5, 9}, 0, 3},             /* 0.7 > 0.3 > 0.1 */
        {1, {5}, {1.0f}, 3, {3, 5, 9}, 0, 5},          /* 0.1 + 1 = 1.1 > 0.7 */
        {2, {5, 5}, {0.4f, 0.4f}, 3, {3, 5, 9}, 0, 5}, /* repeated id: 0.9 > 0.7 */
        {2, {5, 9}, {0.4f, 0.5f}, 3, {3, 5, 9}, 0, 9}, /* 0.5, 0.8 > 0.7 */
        {1, {0}, {100.0f}, 3, {3, 5, 9}, 0, 3},        /* bias on a banned token */
        {0, {0}, {0}, 2, {3, 9}, 0.5f, 9},             /* penalty after: 0.2 < 0.3 */
        {1, {9}, {-0.5f}, 2, {3, 9}, 0.5f, 3},         /* 0.2 > -0.2 */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint32_t bits[1];
        tl_sample_params p = sp(0, 0, 1, 0);
        p.presence_penalty = c[i].presence;
        p.n_bias = c[i].n_bias, p.bias_ids = c[i].ids, p.bias_vals = c[i].vals;
        if (c[i].n_allow >= 0) {
            set_allow(bits, 1, c[i].allow, c[i].n_allow);
            p.allow = bits;
        }
        history h = {gen3, 2, 1};
        double pl[12];
        ref_penalised(L12, 12, &p, h, pl);
        CHECK_EQ_INT(ref_argmax(pl, 12), c[i].want);
        int got = host_token(L12, 12, &p, h);
        if (got != c[i].want) fprintf(stderr, "  restrict case %zu: %d\n", i, got);
        CHECK_EQ_INT(got, c[i].want);
    }
}

/* Nothing left to sample: token -2, no draw, greedy or sampled; the logprob of a forced token is
 * that of the unmodified logits. */
static void test_restrict_none_and_logprob(void) {
    float l[40];
    for (int i = 0; i < 40; i++) l[i] = (float)((i * 5) % 11) * 0.3f;
    l[33] = -INFINITY;
    uint32_t bits[2] = {0, 0};
    for (int temp = 0; temp < 2; temp++) {
        tl_sample_params p = sp(temp ? 1.0f : 0.0f, 0, 1, 0);
        p.allow = bits; /* empty */
        uint64_t rng = 5, rng0 = rng;
        tl_sample_out o;
        CHECK_EQ_INT(tl_sample_host(l, 40, &p, &rng, NULL, 0, 0, &o), 0);
        CHECK_EQ_INT(o.token, TL_TOKEN_NONE_ALLOWED);
        CHECK(rng == rng0);
        bits[1] = 1u << 1; /* only 33, whose logit is -inf */
        CHECK_EQ_INT(tl_sample_host(l, 40, &p, &rng, NULL, 0, 0, &o), 0);
        CHECK_EQ_INT(o.token, TL_TOKEN_NONE_ALLOWED);
        bits[1] = 0;
    }
    /* a bias of +100 on token 20 forces it; its logprob stays log_softmax(l)[20] */
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < 40; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < 40; i++) z += exp(l[i] - mx);
    int32_t id = 20;
    float v = 100.0f;
    for (int temp = 0; temp < 2; temp++)
        for (int seed = 1; seed <= 20; seed++) {
            tl_sample_params p = sp(temp ? 1.0f : 0.0f, 0, 1, 0);
            p.n_bias = 1, p.bias_ids = &id, p.bias_vals = &v, p.n_logprobs = 2;
            uint64_t rng = tl_rng_seed((uint64_t)seed);
            tl_sample_out o;
            CHECK_EQ_INT(tl_sample_host(l, 40, &p, &rng, NULL, 0, 0, &o), 0);
            CHECK_EQ_INT(o.token, 20);
            CHECK_CLOSE(o.logprob, l[20] - (mx + log(z)), 1e-5, 1e-6);
            CHECK(l[o.top_ids[0]] == (float)mx); /* top logprobs: unmodified too */
        }
}

static void test_restrict_distribution(void) {
    history none = {0};
    static const int32_t h[] = {0, 7, 3, 7, 1, 11, 1, 0, 1};
    history hist = {h, 9, 4};
    uint32_t bits[1];
    static const int allow7[] = {0, 1, 2, 4, 6, 9, 11};
    static const int32_t ids[] = {4, 6, 0, 4};
    static const float vals[] = {1.5f, 2.0f, -0.7f, 0.25f};
    set_allow(bits, 1, allow7, 7);
    tl_sample_params p = sp(1, 0, 1, 0);
    p.allow = bits;
    CHECK_EQ_INT(check_distribution("allow 7 of 12", L12, 12, &p, none), 7);
    p.n_bias = 4, p.bias_ids = ids, p.bias_vals = vals;
    CHECK_EQ_INT(check_distribution("allow 7 + bias", L12, 12, &p, none), 7);
    p = sp(0.8f, 3, 1, 0);
    p.allow = bits, p.n_bias = 4, p.bias_ids = ids, p.bias_vals = vals;
    CHECK_EQ_INT(check_distribution("allow+bias, T0.8, k3", L12, 12, &p, none), 3);
    p = sp(1, 0, 0.7f, 0);
    p.n_bias = 4, p.bias_ids = ids, p.bias_vals = vals;
    p.presence_penalty = 0.8f, p.repetition_penalty = 1.3f;
    check_distribution("bias, top_p, penalties", L12, 12, &p, hist);
    static const int32_t ban[] = {0, 7, 1};
    static const float m100[] = {-100.0f, -100.0f, -100.0f};
    p = sp(1, 0, 1, 0);
    p.n_bias = 3, p.bias_ids = ban, p.bias_vals = m100;
    /* -100 is e^-100 of the mass: no draw in 1e5 lands there; the reference keeps them as
     * candidates of ~1e-44 probability, which add nothing to chi2 */
    check_distribution("bias -100 on 3", L12, 12, &p, none);
}

/* ====== Speculative decoding: the dense distribution and the acceptance routine. ====== */

/* tl_sample_probs is the law tl_sample_host draws from: equal to the reference distribution. */
static void test_sample_probs(void) {
    const int32_t hist[5] = {3, 7, 0, 7, 11};
    history h = {hist, 5, 2}, none = {0};
    tl_sample_params ps[5] = {sp(1, 0, 1, 0), sp(0.7f, 5, 0.8f, 0), sp(1.3f, 0, 0.9f, 0.05f),
                              sp(1, 6, 1, 0), sp(0.9f, 0, 1, 0.2f)};
    ps[3].presence_penalty = 0.5f, ps[3].frequency_penalty = 0.3f, ps[3].repetition_penalty = 1.3f;
    float pr[12];
    double q[12], worst = 0;
    for (int k = 0; k < 5; k++) {
        history hh = k == 3 ? h : none;
        CHECK_EQ_INT(tl_sample_probs(L12, 12, &ps[k], hh.hist, hh.n_hist, hh.n_prompt, pr), 1);
        ref_distribution(L12, 12, &ps[k], hh, q);
        for (int i = 0; i < 12; i++) {
            worst = fmax(worst, fabs(pr[i] - q[i]));
            CHECK((pr[i] == 0) == (q[i] == 0)); /* the same candidate set */
        }
    }
    printf("# tl_sample_probs vs reference: max diff %.2g\n", worst);
    CHECK(worst < 1e-6); /* float probabilities of a double reference */
    tl_sample_params g = sp(0, 0, 1, 0);
    CHECK_EQ_INT(tl_sample_probs(L12, 12, &g, NULL, 0, 0, pr), 1);
    for (int i = 0; i < 12; i++) CHECK(pr[i] == (i == 0 ? 1.0f : 0.0f)); /* argmax of L12 */
    float bad[12];
    memcpy(bad, L12, sizeof bad);
    bad[4] = NAN;
    CHECK_EQ_INT(tl_sample_probs(bad, 12, &ps[0], NULL, 0, 0, pr), 0);
}

/* The verdict on N tokens of speculative sampling (cnt: how often each token came out, acc: how
 * many drafts were accepted, outside: tokens outside p's support or with a wrong logprob): the
 * emitted tokens follow p (chi-square, bound as check_distribution's), none outside, and the
 * acceptance rate is sum_i min(p_i, q_i) (the theory of rejection sampling) within 5 standard
 * deviations. */
static void accept_verdict(const char *name, const double *pd, const double *qd, int V,
                           const int *cnt, int N, int acc, int outside) {
    double chi2 = 0, want = 0;
    int k = 0;
    for (int i = 0; i < V; i++) {
        want += fmin(pd[i], qd[i]);
        if (pd[i] == 0) continue;
        k++;
        chi2 += (cnt[i] - pd[i] * N) * (cnt[i] - pd[i] * N) / (pd[i] * N);
    }
    double df = k > 1 ? k - 1 : 1, a3 = 2 / (9 * df), c3 = 1 - a3 + 5 * sqrt(a3);
    double bound = df * c3 * c3 * c3, rate = (double)acc / N;
    double sd = sqrt(fmax(want * (1 - want), 1e-12) / N);
    printf("# accept %-16s chi2 %6.1f (bound %.0f), acceptance %.4f (theory %.4f)\n", name, chi2,
           bound, rate, want);
    CHECK_EQ_INT(outside, 0);
    CHECK(k == 1 ? cnt[0] + outside == N || chi2 == 0 : chi2 < bound);
    CHECK(fabs(rate - want) <= 5 * sd + 1e-9);
}

/* Random laws p and q over V tokens with partly disjoint supports. */
static void random_pq(uint64_t *r, double *p, double *q, int V) {
    double sp_ = 0, sq = 0;
    for (int i = 0; i < V; i++) {
        p[i] = tl_rng_uniform(r) < 0.2 ? 0 : tl_rng_uniform(r);
        q[i] = tl_rng_uniform(r) < 0.2 ? 0 : tl_rng_uniform(r) * tl_rng_uniform(r);
        sp_ += p[i], sq += q[i];
    }
    for (int i = 0; i < V; i++) p[i] /= sp_, q[i] /= sq;
}

/* One token of speculative sampling, many times: d ~ q (drawn here), then tl_spec_accept, judged
 * by accept_verdict. */
static void check_accept_law(const char *name, const double *pd, const double *qd, int V) {
    enum { N = 200000 };
    float p[16], q[16];
    for (int i = 0; i < V; i++) p[i] = (float)pd[i], q[i] = (float)qd[i];
    int cnt[16] = {0}, acc = 0, outside = 0;
    uint64_t rq = tl_rng_seed(4242), ra = tl_rng_seed(777);
    for (int t = 0; t < N; t++) {
        double u = tl_rng_uniform(&rq), c = 0;
        int d = -1;
        for (int i = 0; i < V && d < 0; i++)
            if (qd[i] > 0 && u < (c += qd[i])) d = i;
        for (int i = V - 1; d < 0; i--) /* rounding: the last of positive mass */
            if (qd[i] > 0) d = i;
        int a, tok = tl_spec_accept(p, q, V, d, &ra, &a);
        acc += a;
        if (tok < 0 || tok >= V || pd[tok] == 0)
            outside++;
        else
            cnt[tok]++;
    }
    accept_verdict(name, pd, qd, V, cnt, N, acc, outside);
}

static void test_spec_accept(void) {
    enum { V = 12 };
    double p[V], q[V];
    /* random p and q with partly disjoint supports */
    uint64_t r = tl_rng_seed(99);
    for (int trial = 0; trial < 3; trial++) {
        random_pq(&r, p, q, V);
        char nm[32];
        snprintf(nm, sizeof nm, "random %d", trial % 10);
        check_accept_law(nm, p, q, V);
    }
    /* q == p: every draft accepted */
    check_accept_law("q = p", p, p, V);
    /* disjoint supports: never accepted, the token still follows p */
    for (int i = 0; i < V; i++) p[i] = i < 6 ? (i + 1) / 21.0 : 0, q[i] = i < 6 ? 0 : 1.0 / 6;
    check_accept_law("disjoint", p, q, V);
    /* q uniform, p peaked */
    for (int i = 0; i < V; i++) p[i] = i == 3 ? 0.89 : 0.01, q[i] = 1.0 / V;
    check_accept_law("uniform q", p, q, V);
    /* greedy (one-hot p and q): accepted exactly when they agree, else the target's token */
    float po[V] = {0}, qo[V] = {0};
    po[5] = 1, qo[5] = 1;
    uint64_t rr = tl_rng_seed(1);
    int a, t = tl_spec_accept(po, qo, V, 5, &rr, &a);
    CHECK_EQ_INT(a, 1);
    CHECK_EQ_INT(t, 5);
    qo[5] = 0, qo[2] = 1;
    t = tl_spec_accept(po, qo, V, 2, &rr, &a);
    CHECK_EQ_INT(a, 0);
    CHECK_EQ_INT(t, 5);
}

/* ====== Sparse laws (tl_sample_law, tl_law_draw, tl_spec_accept_law). ====== */

/* tl_sample_law against the dense tl_sample_probs on random logits (V = 300, a few exact ties,
 * a history with penalties): the same survivors (most likely first), the same probabilities,
 * and logprobs equal to tl_sample_logprobs'. */
static void test_sample_law(void) {
    enum { V = 300 };
    float l[V], pr[V];
    int32_t hist[40];
    uint64_t r = tl_rng_seed(5);
    tl_sample_params ps[6] = {sp(0, 0, 1, 0),    sp(1, 20, 0.95f, 0),
                              sp(0.7f, 5, 1, 0), sp(1.3f, 64, 0.9f, 0.02f),
                              sp(1, 1, 1, 0),    sp(0.5f, 40, 0.5f, 0)};
    ps[0].presence_penalty = 1.5f, ps[1].presence_penalty = 1.5f;
    ps[3].frequency_penalty = 0.4f, ps[3].repetition_penalty = 1.2f;
    double worst = 0;
    int cases = 0;
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < V; i++) l[i] = (float)(4 * (tl_rng_uniform(&r) - 0.5));
        for (int i = 0; i < 8; i++) l[(int)(tl_rng_uniform(&r) * V)] = l[7]; /* exact ties */
        for (int i = 0; i < 40; i++) hist[i] = (int32_t)(tl_rng_uniform(&r) * V);
        for (int k = 0; k < 6; k++) {
            tl_law law;
            CHECK(tl_law_ok(&ps[k]));
            CHECK_EQ_INT(tl_sample_law(l, V, &ps[k], hist, 40, 25, &law), 0);
            CHECK_EQ_INT(tl_sample_probs(l, V, &ps[k], hist, 40, 25, pr), 1);
            int nz = 0;
            for (int i = 0; i < V; i++) nz += pr[i] > 0;
            CHECK_EQ_INT(law.n, nz);
            for (int i = 0; i < law.n; i++) {
                worst = fmax(worst, fabs(law.p[i] - pr[law.id[i]]));
                CHECK(i == 0 || law.p[i] <= law.p[i - 1]);
                tl_sample_out o;
                tl_sample_logprobs(l, V, law.id[i], 0, &o);
                CHECK(law.lp[i] == o.logprob);
            }
            cases++;
        }
    }
    printf("# tl_sample_law vs tl_sample_probs: %d cases, max diff %.2g\n", cases, worst);
    CHECK(worst < 1e-6);
    tl_sample_params no = sp(1, 0, 1, 0); /* top-k off: no sparse law */
    CHECK(!tl_law_ok(&no));
    no = sp(1, 20, 1, 0), no.n_logprobs = 2;
    CHECK(!tl_law_ok(&no));
    tl_law law;
    l[3] = NAN;
    CHECK_EQ_INT(tl_sample_law(l, V, &ps[1], NULL, 0, 0, &law), 0);
    CHECK_EQ_INT(law.n, 0);
}

/* A dense law into sparse form (most likely first; the logprobs are not used here). */
static void to_law(const double *pd, int V, tl_law *o) {
    o->n = 0;
    for (int i = 0; i < V; i++) {
        if (pd[i] <= 0) continue;
        int j = o->n++;
        for (; j > 0 && o->p[j - 1] < pd[i]; j--)
            o->id[j] = o->id[j - 1], o->p[j] = o->p[j - 1], o->lp[j] = o->lp[j - 1];
        o->id[j] = i, o->p[j] = (float)pd[i], o->lp[j] = (float)log(pd[i]);
    }
}

/* tl_spec_accept_law, as check_accept_law for the dense routine; drafts drawn by tl_law_draw,
 * and the returned logprob must be the survivor's own. */
static void check_accept_sparse(const char *name, const double *pd, const double *qd, int V) {
    enum { N = 200000 };
    tl_law p, q;
    to_law(pd, V, &p), to_law(qd, V, &q);
    int cnt[16] = {0}, acc = 0, outside = 0;
    uint64_t rq = tl_rng_seed(4243), ra = tl_rng_seed(778);
    for (int t = 0; t < N; t++) {
        int d = tl_law_draw(&q, 0, &rq), a;
        float lp;
        int tok = tl_spec_accept_law(&p, &q, d, &ra, &a, &lp);
        acc += a;
        if (tok < 0 || tok >= V || pd[tok] == 0 || lp != (float)log(pd[tok]))
            outside++;
        else
            cnt[tok]++;
    }
    accept_verdict(name, pd, qd, V, cnt, N, acc, outside);
}

static void test_spec_accept_law(void) {
    enum { V = 12 };
    double p[V], q[V];
    uint64_t r = tl_rng_seed(98);
    for (int trial = 0; trial < 3; trial++) {
        random_pq(&r, p, q, V);
        char nm[32];
        snprintf(nm, sizeof nm, "sparse random %d", trial);
        check_accept_sparse(nm, p, q, V);
    }
    check_accept_sparse("sparse q = p", p, p, V);
    for (int i = 0; i < V; i++) p[i] = i < 6 ? (i + 1) / 21.0 : 0, q[i] = i < 6 ? 0 : 1.0 / 6;
    check_accept_sparse("sparse disjoint", p, q, V);
}

int main(void) {
    T_RUN(test_sample_probs);
    T_RUN(test_spec_accept);
    T_RUN(test_sample_law);
    T_RUN(test_spec_accept_law);
    T_RUN(test_distribution_filters);
    T_RUN(test_top_p_boundaries);
    T_RUN(test_distribution_penalties);
    T_RUN(test_greedy_penalty_cases);
    T_RUN(test_greedy_random);
    T_RUN(test_logprobs);
    T_RUN(test_non_finite);
    T_RUN(test_restrict_greedy_cases);
    T_RUN(test_restrict_none_and_logprob);
    T_RUN(test_restrict_distribution);
    return t_summary();
}
