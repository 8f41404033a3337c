/* Public attention entry point: degenerate shapes, the SIMD variant (AVX-512, AVX2 or scalar: once,
 * hs_cpu_level; bfloat16 on AVX512_BF16 where hs_cpu_bf16_dot), the thread count. The kernel itself is attention.inc. */
#include <string.h>
#include "cpu_features.h"
#include "attention.h"
#include "dtypes.h"

HS_VARIANTS(int, hs_attention_run, (const void *q, const void *k, const void *v, void *out, int dt,
                                    int64_t batch, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                                    float scale, int causal, const int64_t *kv_len, int nthreads))

/* bfloat16 Q.K^T on vdpbf16ps (attention_bf16dot.c), for even head_dim: a key's pairs are read in place */
int hs_attention_run_avx512bf16(const void *q, const void *k, const void *v, void *out, int dt, int64_t batch,
                                int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, float scale, int causal,
                                const int64_t *kv_len, int nthreads);


int hs_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t slabs,
                     int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal) {
    return hs_attention(q, k, v, out, HS_F32, slabs, 1, 1, seq_q, seq_k, head_dim, scale, causal, NULL);
}

int hs_attention(const void *q, const void *k, const void *v, void *out, int dtype, int64_t batch, int64_t heads_q,
                 int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                 const int64_t *kv_len) {
    int64_t slabs = batch * heads_q;
    if (slabs <= 0 || seq_q <= 0 || head_dim <= 0) return 0;
    if (heads_kv <= 0 || heads_q % heads_kv) return -2;
    if (seq_k <= 0) {  /* softmax over no keys weighs nothing: zeros (all-zero bits in every dtype) */
        memset(out, 0, (size_t)(dtype == HS_F32 ? 4 : 2) * (size_t)(slabs * seq_q * head_dim));
        return 0;
    }
    /* the keys a call reads: a KV cache's valid length, not its allocated one (a decode step early in a
     * 2048-position cache reads a few keys; sized by the cache it woke a second thread for microseconds
     * of work, and beside another library's spinning threads a team waiting on a preempted member took
     * milliseconds) */
    int64_t keys = kv_len ? 0 : seq_k;
    if (kv_len)
        for (int64_t b = 0; b < batch; b++) {
            if (kv_len[b] < 0 || kv_len[b] > seq_k) return -2;
            if (kv_len[b] > keys) keys = kv_len[b];
        }
    long long work = (long long)slabs * seq_q * (keys > 0 ? keys : 1) * head_dim;
    int nt = hs_threads_for(work, HS_ATTENTION_GRAIN);
    long long items = seq_q == 1 ? batch * heads_kv * ((keys + 1023) / 1024)
                                 : slabs * ((seq_q + HS_ATTENTION_QTILE - 1) / HS_ATTENTION_QTILE);
    if (items < 1) items = 1;
    if (nt > items) nt = (int)items;
    if (dtype == HS_BF16 && head_dim % 2 == 0 && hs_cpu_bf16_dot())
        return hs_attention_run_avx512bf16(q, k, v, out, dtype, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, scale,
                                           causal, kv_len, nt);
    return HS_PICK(hs_attention_run)(q, k, v, out, dtype, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, scale,
                                     causal, kv_len, nt);
}
