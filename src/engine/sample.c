/* Host sampler (see sample.h): penalties, then argmax (O(V)) or a draw from the sorted, filtered
 * candidates (O(V log V)); logprobs of the unmodified logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "engine/sample.h"

uint64_t tl_rng_seed(uint64_t seed) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL; /* splitmix64 finaliser: decorrelates small seeds */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z ? z : 0x2545f4914f6cdd1dULL;
}

double tl_rng_uniform(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (double)((x * 0x2545f4914f6cdd1dULL) >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    float p;
    int id;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

static void logprobs(const float *l, int V, tl_sample_out *out, int n_top) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    double lse = mx + log(sum);
    out->logprob = (float)(l[out->token] - lse);
    out->n_top = 0;
    for (int j = 0; j < n_top && j < V; j++) { /* selection: n_top is small */
        int best = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int k = 0; k < j; k++) taken |= out->top_ids[k] == i;
            if (!taken && (best < 0 || l[i] > l[best])) best = i;
        }
        out->top_ids[j] = best;
        out->top_logprobs[j] = (float)(l[best] - lse);
        out->n_top = j + 1;
    }
}

/* Repetition penalty over the whole history, presence and frequency over its generated part, in
 * place. One pass with a per-token counter: O(V + n_history). Returns TL_OK or TL_ERR_NOMEM. */
static int apply_penalties(float *l, int V, const tl_sample_params *p, const int32_t *history,
                           int n_history, int n_prompt) {
    int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
    if (!rep && p->presence_penalty == 0 && p->frequency_penalty == 0) return TL_OK;
    int *cnt = calloc((size_t)V, sizeof(int)); /* generated-token counts; -1 = prompt only */
    if (!cnt) return TL_ERR_NOMEM;
    for (int i = 0; i < n_history; i++) {
        int t = history[i];
        if (t < 0 || t >= V) continue;
        if (i >= n_prompt)
            cnt[t] = cnt[t] < 0 ? 1 : cnt[t] + 1;
        else if (cnt[t] == 0)
            cnt[t] = -1;
    }
    for (int t = 0; t < V; t++) {
        if (!cnt[t]) continue;
        if (rep) l[t] = l[t] > 0 ? l[t] / p->repetition_penalty : l[t] * p->repetition_penalty;
        if (cnt[t] > 0) l[t] -= p->frequency_penalty * cnt[t] + p->presence_penalty;
    }
    free(cnt);
    return TL_OK;
}

/* The logit bias and the allowed-token mask (tulip.h), in place: l[i] + the sum of i's bias
 * values (summed in pair order first, as k_sample.cu does), -inf where allow's bit is clear.
 * Bias ids >= V (padding, never sampled) are skipped. Returns 1 if a finite logit is left. */
static int apply_restrictions(float *l, int V, const tl_sample_params *p) {
    for (int j = 0; j < p->n_bias; j++) {
        int id = p->bias_ids[j], first = 1;
        if (id < 0 || id >= V) continue;
        for (int k = 0; k < j && first; k++) first = p->bias_ids[k] != id;
        if (!first) continue;
        float b = p->bias_vals[j];
        for (int k = j + 1; k < p->n_bias; k++)
            if (p->bias_ids[k] == id) b += p->bias_vals[k];
        l[id] += b;
    }
    int any = 0;
    for (int i = 0; i < V; i++) {
        if (p->allow && !(p->allow[i >> 5] >> (i & 31) & 1u)) l[i] = -INFINITY;
        any |= isfinite(l[i]);
    }
    return any;
}

static int restricted(const tl_sample_params *p) { return p->n_bias > 0 || p->allow; }

/* softmax(l / T) into c[0..V), most likely first (lowest id first among equals). */
static void sorted_probs(const float *l, int V, float T, cand *c) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        c[i].id = i;
        c[i].p = (float)exp(((double)l[i] - mx) / T);
        sum += c[i].p;
    }
    for (int i = 0; i < V; i++) c[i].p = (float)(c[i].p / sum);
    qsort(c, V, sizeof(cand), cand_desc);
}

/* How many of the sorted candidates survive, in the CUDA sampler's (and vLLM's) order: min-p
 * (p >= min_p * p_max) and top-k, then top-p over the survivors: the smallest most-likely-first
 * set holding top_p of their mass. At least one always does. */
static int n_candidates(const cand *c, int V, const tl_sample_params *p) {
    int n = 1;
    float thr = p->min_p > 0 ? p->min_p * c[0].p : 0;
    while (n < V && c[n].p >= thr) n++;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p > 0 && p->top_p < 1) {
        double kept = 0, cum = 0;
        for (int i = 0; i < n; i++) kept += c[i].p;
        int k = 0;
        while (k < n) {
            cum += c[k++].p;
            if (cum >= p->top_p * kept) break;
        }
        n = k;
    }
    return n;
}

/* A draw from the first n candidates, renormalised. The fallback (u rounded up to the total) is
 * the last candidate of non-zero probability: a masked token (p = 0) is never drawn. */
static int draw(const cand *c, int n, uint64_t *rng) {
    double tot = 0;
    for (int i = 0; i < n; i++) tot += c[i].p;
    double u = tl_rng_uniform(rng) * tot, acc = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (c[i].p > 0) last = i;
        if (u < acc) return c[i].id;
    }
    return c[last].id;
}

int tl_sample_host(const float *logits, int V, const tl_sample_params *p, uint64_t *rng,
                   const int32_t *history, int n_history, int n_prompt, tl_sample_out *out) {
    int any_finite = 0, poisoned = 0;
    for (int i = 0; i < V; i++) {
        any_finite |= isfinite(logits[i]);
        poisoned |= isnan(logits[i]) || logits[i] == INFINITY;
    }
    if (poisoned || !any_finite) { /* no distribution (as k_sample.cu): a poisoned model */
        memset(out, 0, sizeof *out);
        out->token = TL_TOKEN_NON_FINITE, out->logprob = NAN;
        return TL_OK;
    }
    float *l = malloc(sizeof(float) * V);
    cand *c = p->temperature > 0 ? malloc(sizeof(cand) * V) : NULL;
    int rc = l && (c || p->temperature <= 0) ? TL_OK : TL_ERR_NOMEM;
    if (!rc) memcpy(l, logits, sizeof(float) * V);
    if (!rc && restricted(p) && !apply_restrictions(l, V, p)) { /* nothing left to sample */
        memset(out, 0, sizeof *out);
        out->token = TL_TOKEN_NONE_ALLOWED, out->logprob = NAN;
        free(c);
        free(l);
        return TL_OK;
    }
    if (!rc) rc = apply_penalties(l, V, p, history, n_history, n_prompt);
    if (!rc && p->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best]) best = i;
        out->token = best;
    } else if (!rc) {
        sorted_probs(l, V, p->temperature, c);
        out->token = draw(c, n_candidates(c, V, p), rng);
    }
    if (!rc) logprobs(logits, V, out, TL_MIN(TL_MAX(p->n_logprobs, 0), TL_MAX_LOGPROBS));
    free(c);
    free(l);
    return rc;
}

/* ====== Speculative decoding helpers (docs/architecture.md §3.6). ====== */

int tl_sample_probs(const float *logits, int V, const tl_sample_params *p, const int32_t *history,
                    int n_history, int n_prompt, float *probs) {
    int ok = 1;
    for (int i = 0; i < V && ok; i++) ok = isfinite(logits[i]) || logits[i] == -INFINITY;
    float *l = ok ? malloc(sizeof(float) * V) : NULL;
    cand *c = ok && p->temperature > 0 ? malloc(sizeof(cand) * V) : NULL;
    if (ok && (!l || (p->temperature > 0 && !c))) {
        free(l), free(c);
        return TL_ERR_NOMEM;
    }
    if (ok) memcpy(l, logits, sizeof(float) * V);
    if (ok && restricted(p)) ok = apply_restrictions(l, V, p);
    if (ok && apply_penalties(l, V, p, history, n_history, n_prompt)) {
        free(l), free(c);
        return TL_ERR_NOMEM;
    }
    if (ok) {
        int any = 0;
        for (int i = 0; i < V; i++) any |= isfinite(l[i]);
        ok = any;
    }
    if (ok) {
        memset(probs, 0, sizeof(float) * V);
        if (p->temperature <= 0) {
            int best = 0;
            for (int i = 1; i < V; i++)
                if (l[i] > l[best]) best = i;
            probs[best] = 1;
        } else {
            sorted_probs(l, V, p->temperature, c);
            int n = n_candidates(c, V, p);
            double tot = 0;
            for (int i = 0; i < n; i++) tot += c[i].p;
            for (int i = 0; i < n; i++) probs[c[i].id] = (float)(c[i].p / tot);
        }
    }
    free(l), free(c);
    return ok;
}

void tl_sample_logprobs(const float *logits, int V, int token, int n_top, tl_sample_out *out) {
    memset(out, 0, sizeof *out);
    out->token = token;
    logprobs(logits, V, out, TL_MIN(TL_MAX(n_top, 0), TL_MAX_LOGPROBS));
}

int tl_spec_accept(const float *p, const float *q, int V, int d, uint64_t *rng, int *accepted) {
    double u = tl_rng_uniform(rng);
    /* accept when u < p/q, written without the division: q[d] > 0 for a drawn d */
    if (u * (double)q[d] < (double)p[d]) {
        *accepted = 1;
        return d;
    }
    *accepted = 0;
    double tot = 0;
    for (int i = 0; i < V; i++) tot += p[i] > q[i] ? (double)p[i] - q[i] : 0;
    int use_p = !(tot > 0);
    if (use_p)
        for (int i = 0; i < V; i++) tot += p[i];
    double r = tl_rng_uniform(rng) * tot, acc = 0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        double w = use_p ? p[i] : (p[i] > q[i] ? (double)p[i] - q[i] : 0);
        if (w <= 0) continue;
        acc += w;
        last = i;
        if (r < acc) return i;
    }
    return last >= 0 ? last : d;
}

/* ====== Sparse laws (backend.h tl_law; docs/architecture.md §3.6). ====== */

int tl_law_ok(const tl_sample_params *p) {
    return p->n_logprobs <= 0 && p->n_bias <= 0 && !p->allow &&
           (p->temperature <= 0 || (p->top_k >= 1 && p->top_k <= TL_LAW_MAX));
}

/* The k largest of l[0..V) into id[] (largest first, ties: lower id first); returns how many. */
static int top_ids(const float *l, int V, int k, int32_t *id) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (l[i] == -INFINITY || (n == k && !(l[i] > l[id[n - 1]]))) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && l[i] > l[id[j - 1]]) id[j] = id[j - 1], j--;
        id[j] = i;
    }
    return n;
}

/* The survivors of the candidates id[0..n) (sorted) as in n_candidates (and the CUDA sampler's
 * merge: the 40-nat window below the best too, under float resolution of the mass): their
 * count, with their renormalised probabilities into law->p. */
static int law_survivors(const float *l, const tl_sample_params *p, int n, tl_law *law) {
    double w[TL_LAW_MAX], best = l[law->id[0]] / p->temperature, kept = 0, cum = 0;
    int keep = 0;
    for (; keep < n; keep++) {
        double x = l[law->id[keep]] / p->temperature - best;
        if (x < -40.0 || (p->min_p > 0 && x < log(p->min_p))) break;
        w[keep] = exp(x), kept += w[keep];
    }
    if (p->top_p > 0 && p->top_p < 1) {
        int k2 = 0;
        while (k2 < keep) {
            cum += w[k2++];
            if (cum >= (double)p->top_p * kept) break;
        }
        keep = k2;
    }
    keep = keep < 1 ? 1 : keep;
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += w[i];
    for (int i = 0; i < keep; i++) law->p[i] = (float)(w[i] / tot);
    return keep;
}

int tl_sample_law(const float *logits, int V, const tl_sample_params *p, const int32_t *history,
                  int n_history, int n_prompt, tl_law *law) {
    law->n = 0;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) return TL_OK; /* no law */
        mx = logits[i] > mx ? logits[i] : mx;
    }
    if (mx == -INFINITY) return TL_OK;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    float *l = malloc(sizeof(float) * V);
    if (!l) return TL_ERR_NOMEM;
    memcpy(l, logits, sizeof(float) * V);
    int rc = apply_penalties(l, V, p, history, n_history, n_prompt);
    int n = rc ? 0 : top_ids(l, V, p->temperature <= 0 ? 1 : p->top_k, law->id);
    if (n > 0 && p->temperature <= 0)
        law->n = 1, law->p[0] = 1.0f;
    else if (n > 0)
        law->n = law_survivors(l, p, n, law);
    double lse = mx + log(sum); /* the logprobs as logprobs() rounds them */
    for (int i = 0; i < law->n; i++) law->lp[i] = (float)(logits[law->id[i]] - lse);
    free(l);
    return rc;
}

int tl_law_pick(const tl_law *q, double u01) {
    double tot = 0, acc = 0;
    for (int i = 0; i < q->n; i++) tot += q->p[i];
    double u = u01 * tot;
    int last = 0;
    for (int i = 0; i < q->n; i++) {
        if (q->p[i] <= 0) continue;
        acc += q->p[i], last = i;
        if (u < acc) return q->id[i];
    }
    return q->id[last];
}

int tl_law_draw(const tl_law *q, int greedy, uint64_t *rng) {
    if (greedy || q->n == 1) return q->id[0];
    return tl_law_pick(q, tl_rng_uniform(rng));
}

static float law_p(const tl_law *l, int token) {
    for (int i = 0; i < l->n; i++)
        if (l->id[i] == token) return l->p[i];
    return 0.0f;
}

float tl_law_logprob(const tl_law *p, int token) {
    for (int i = 0; i < p->n; i++)
        if (p->id[i] == token) return p->lp[i];
    return NAN;
}

int tl_spec_accept_law(const tl_law *p, const tl_law *q, int d, uint64_t *rng, int *accepted,
                       float *logprob) {
    double u = tl_rng_uniform(rng), pd = law_p(p, d), qd = law_p(q, d);
    int t = d;
    *accepted = u * qd < pd; /* u < p/q without the division: q(d) > 0 for a drawn d */
    if (!*accepted) {
        double w[TL_LAW_MAX], tot = 0;
        for (int i = 0; i < p->n; i++) {
            double x = (double)p->p[i] - law_p(q, p->id[i]);
            w[i] = x > 0 ? x : 0, tot += w[i];
        }
        if (!(tot > 0))
            for (int i = 0; i < p->n; i++) tot += (w[i] = p->p[i]);
        double r = tl_rng_uniform(rng) * tot, acc = 0;
        int last = -1;
        for (int i = 0; i < p->n && t == d; i++) {
            if (w[i] <= 0) continue;
            acc += w[i], last = i;
            if (r < acc) t = p->id[i];
        }
        if (t == d && last >= 0) t = p->id[last];
    }
    *logprob = tl_law_logprob(p, t);
    return t;
}
