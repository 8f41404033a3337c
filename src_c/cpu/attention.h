/* Scaled dot-product attention on contiguous float32 (batch*heads, seq, head_dim) slabs, tiled with an
 * online softmax (flash attention): scratch is O(tile * (head_dim + tile)) per thread, never
 * seq_q x seq_k. The public function picks its SIMD variant once (cpu_features.h) and splits
 * (slab, query tile) work items over OpenMP threads; callers release the GIL. */
#ifndef HS_ATTENTION_H
#define HS_ATTENTION_H
#include <stdint.h>

/* Queries per work item: threads split (slab, query tile) pairs. */
#define HS_ATTENTION_QTILE 64

/* Least multiply-adds worth a thread (~0.1 ms of work): a parallel region costs microseconds (a sleeping
 * team's wake, on a VM, a hundred or more). The call's team and the decode's combine are sized by it. */
#define HS_ATTENTION_GRAIN (1LL << 20)

/* out[s, i, :] = sum_j softmax_j(scale * q[s, i, :] . k[s, j, :]) v[s, j, :] for s < slabs, i < seq_q,
 * j < seq_k; with `causal`, query i sees keys j <= i only (top-left aligned, as PyTorch's is_causal).
 * seq_k == 0 gives zeros. Returns 0, or -1 when the per-thread scratch could not be allocated. */
int hs_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t slabs,
                     int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal);

/* The same for q, k, v and out all of storage type `dtype` (dtypes.h: HS_F32, HS_F16, HS_BF16; half
 * as uint16_t bits), q (batch, heads_q, seq_q, d), k and v (batch, heads_kv, seq_k, d) with heads_q a
 * multiple of heads_kv: query head h reads KV head h / (heads_q / heads_kv). causal: 0 none, 1 top-left
 * (key j visible to query i iff j <= i), 2 bottom-right (j <= i + kv - seq_q). kv_len: NULL, or (batch,)
 * valid key counts in [0, seq_k] (kv above; NULL: kv = seq_k); keys at or past it are ignored. A query
 * that sees no key gives zeros. seq_q == 1 runs the decode path (each KV head's keys read once for its
 * group of query heads). Half K and V are widened one key tile at a time into per-thread scratch (never
 * whole), queries on entry to their tile; scores, running max and sum and the output accumulate in
 * float32, and the output is rounded once to the dtype. Returns 0, -1 when scratch could not be
 * allocated, -2 for heads or kv_len out of their ranges. */
int hs_attention(const void *q, const void *k, const void *v, void *out, int dtype, int64_t batch, int64_t heads_q,
                 int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                 const int64_t *kv_len);
#endif
