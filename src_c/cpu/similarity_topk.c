/* Exact top-k selection over rows of scores (no SIMD: one compare per score, rarely an insert).
 * Order: higher score first, equal scores by lower index, NaN after every number. Few rows: each row
 * is split over the threads and the per-thread lists merged; many rows: a row per thread. */
#include <math.h>
#include <stdlib.h>
#include "cpu_features.h"
#include "similarity.h"

#define HS_TOPK_INSERT_MAX 128  /* above this k, sorting the row beats insertion into a sorted list */

static inline int hs_better(float sa, int64_t ia, float sb, int64_t ib) {
    int na = isnan(sa), nb = isnan(sb);
    if (na | nb) return nb && (!na || ia < ib);
    return sa > sb || (sa == sb && ia < ib);
}

/* Insert (s, i) into the sorted list vs/is holding *cnt of at most k entries, if it makes the cut. */
static inline void hs_insert(float s, int64_t i, int64_t k, float *vs, int64_t *is, int64_t *cnt) {
    int64_t p;
    if (*cnt < k) {
        p = (*cnt)++;
    } else {
        if (!hs_better(s, i, vs[k - 1], is[k - 1])) return;
        p = k - 1;
    }
    while (p > 0 && hs_better(s, i, vs[p - 1], is[p - 1])) {
        vs[p] = vs[p - 1];
        is[p] = is[p - 1];
        p--;
    }
    vs[p] = s;
    is[p] = i;
}

/* Scores [lo, hi) of one row: indices only grow, so a full list rejects with one float compare
 * (equal score at a higher index loses; NaN loses to any number). */
static int64_t hs_scan(const float *s, int64_t lo, int64_t hi, int64_t k, float *vs, int64_t *is) {
    int64_t cnt = 0;
    for (int64_t i = lo; i < hi; i++) {
        float x = s[i];
        if (cnt == k) {
            float w = vs[k - 1];
            if (!(x > w || (isnan(w) && !isnan(x)))) continue;
        }
        hs_insert(x, i, k, vs, is, &cnt);
    }
    return cnt;
}

typedef struct { float s; int64_t i; } hs_scored;

static int hs_cmp_scored(const void *a, const void *b) {
    const hs_scored *x = a, *y = b;
    return hs_better(x->s, x->i, y->s, y->i) ? -1 : (hs_better(y->s, y->i, x->s, x->i) ? 1 : 0);
}

static int hs_topk_sorted(const float *s, int64_t n, int64_t k, int64_t *idx, float *val) {
    hs_scored *all = malloc(sizeof(hs_scored) * (size_t)n);
    if (!all) return -1;
    for (int64_t i = 0; i < n; i++) { all[i].s = s[i]; all[i].i = i; }
    qsort(all, (size_t)n, sizeof(hs_scored), hs_cmp_scored);
    for (int64_t j = 0; j < k; j++) { idx[j] = all[j].i; val[j] = all[j].s; }
    free(all);
    return 0;
}

int hs_topk_f32(const float *scores, int64_t m, int64_t n, int64_t k, int64_t *idx, float *val) {
    if (m <= 0 || k <= 0) return 0;
    int nt = hs_threads_for(m * n, 1 << 16);
    if (k > HS_TOPK_INSERT_MAX) {
        int failed = 0;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1) reduction(|: failed)
        for (int64_t r = 0; r < m; r++) failed |= hs_topk_sorted(scores + r * n, n, k, idx + r * k, val + r * k) != 0;
        return failed ? -1 : 0;
    }
    int64_t chunks = m >= nt ? 1 : 4 * nt, items = m * chunks;  /* a few chunks per thread, for balance */
    if (chunks == 1) {
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int64_t r = 0; r < m; r++) hs_scan(scores + r * n, 0, n, k, val + r * k, idx + r * k);
        return 0;
    }
    float *cv = malloc(sizeof(float) * (size_t)(items * k));
    int64_t *ci = malloc(sizeof(int64_t) * (size_t)(items * k)), *cc = malloc(sizeof(int64_t) * (size_t)items);
    if (!cv || !ci || !cc) { free(cv); free(ci); free(cc); return -1; }
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t it = 0; it < items; it++) {
        int64_t r = it / chunks, c = it % chunks, step = (n + chunks - 1) / chunks;
        int64_t lo = c * step < n ? c * step : n, hi = lo + step < n ? lo + step : n;
        cc[it] = hs_scan(scores + r * n, lo, hi, k, cv + it * k, ci + it * k);
    }
    for (int64_t r = 0; r < m; r++) {
        int64_t cnt = 0;
        for (int64_t c = 0; c < chunks; c++) {
            int64_t it = r * chunks + c;
            for (int64_t j = 0; j < cc[it]; j++) hs_insert(cv[it * k + j], ci[it * k + j], k, val + r * k, idx + r * k, &cnt);
        }
    }
    free(cv); free(ci); free(cc);
    return 0;
}
