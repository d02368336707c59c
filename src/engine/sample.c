/* Host sampler (see sample.h). O(V log V) only when top-p/top-k need an order; greedy is O(V). */
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

int tl_sample_host(const float *logits, int V, const tl_sample_params *p, uint64_t *rng,
                   const int32_t *history, int n_history, int n_prompt, tl_sample_out *out) {
    float *l = malloc(sizeof(float) * V);
    if (!l) return TL_ERR_NOMEM;
    memcpy(l, logits, sizeof(float) * V);
    int n_top = TL_MIN(TL_MAX(p->n_logprobs, 0), TL_MAX_LOGPROBS);

    /* penalties: one pass over the history with a per-token counter (O(V + n_history)) */
    int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
    if (rep || p->presence_penalty != 0 || p->frequency_penalty != 0) {
        int *cnt = calloc((size_t)V, sizeof(int)); /* generated-token counts; -1 = prompt only */
        if (!cnt) {
            free(l);
            return TL_ERR_NOMEM;
        }
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
    }

    if (p->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best]) best = i;
        out->token = best;
    } else {
        cand *c = malloc(sizeof(cand) * V);
        if (!c) {
            free(l);
            return TL_ERR_NOMEM;
        }
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        double sum = 0;
        for (int i = 0; i < V; i++) {
            c[i].id = i;
            c[i].p = (float)exp(((double)l[i] - mx) / p->temperature);
            sum += c[i].p;
        }
        for (int i = 0; i < V; i++) c[i].p = (float)(c[i].p / sum);
        qsort(c, V, sizeof(cand), cand_desc);
        int n = V;
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        if (p->top_p > 0 && p->top_p < 1) {
            double cum = 0;
            int k = 0;
            while (k < n) {
                cum += c[k++].p;
                if (cum >= p->top_p) break;
            }
            n = k;
        }
        if (p->min_p > 0) {
            float thr = p->min_p * c[0].p;
            int k = 1;
            while (k < n && c[k].p >= thr) k++;
            n = k;
        }
        double tot = 0;
        for (int i = 0; i < n; i++) tot += c[i].p;
        double u = tl_rng_uniform(rng) * tot, acc = 0;
        int pick = c[n - 1].id;
        for (int i = 0; i < n; i++) {
            acc += c[i].p;
            if (u < acc) {
                pick = c[i].id;
                break;
            }
        }
        out->token = pick;
        free(c);
    }
    logprobs(logits, V, out, n_top);
    free(l);
    return TL_OK;
}
