/* Running the Mamba-1 GPU model (see mamba1_gpu.h): prefill chunks and
 * decode steps through one forward routine, decode graphs per bucket.
 *
 * Rows are sequences x time steps; projections are mbd_gpu_gemm calls
 * (row-invariant by the GEMM contract), and the conv and scan kernels walk
 * each sequence's time steps in order from its slot's state, so a row's bits
 * never depend on the batch, the chunking or the bucket. in_proj, out_proj and
 * the LM head are mbd_gpu_gemm calls; x_proj (N = dt_rank + 2 d_state, tiny)
 * is one mbd_mops_xproj launch and dt_proj is folded into the scan kernel,
 * each with its own row-invariant contract (mamba_ops.h, docs/route.md "Model
 * kernels"). Small-batch decode folds the conv into x_proj and the scan
 * (mbd_mops_conv_fused); where the route allows it, decode batches of 1..4
 * rows run every layer in one persistent launch (decode_persistent.h).
 * Graphs are captured on first use of a bucket. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/gpu_check.h"
#include "kernels/cuda/mamba1_gpu_impl.h"
extern "C" {
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/mamba_ops.h"
}

/* Stage event i, where the step has step events (mamba1_gpu.h). */
static void step_mark(const mbd_mamba1_gpu *m, int i) {
  /* External: an event record node of the graph, not a capture-internal join */
  if (m->marking) (void)cudaEventRecordWithFlags(m->step_ev[i], m->stream, cudaEventRecordExternal);
}

/* ------------------------------------------------------------ forward */

static int gemm(mbd_mamba1_gpu *m, int64_t M, int64_t N, int64_t K, const void *x,
                const void *w, const void *b, void *y, mbd_dtype out_dt, mbd_error *err) {
  mbd_gpu_gemm_args a;
  a.dtype = m->dtype;
  a.out_dtype = out_dt;
  a.m = M;
  a.n = N;
  a.k = K;
  a.x = x;
  a.w = w;
  a.bias = b;
  a.y = y;
  a.w_static = 1; /* weights and biases never change after load */
  return mbd_gpu_gemm(m->ctx, &a, err);
}

int mbd_mamba1_gpu_persistent(const mbd_mamba1_gpu *m, int rows) {
  /* the persistent decode keeps an f32 state only: a bf16-state route
   * decodes per op */
  return m->decode == MBD_DECODE_PERSISTENT && m->ssm_es == 4 &&
         mbd_gpu_ctx_mode(m->ctx) == MBD_GEMM_DETERMINISTIC && mbd_dp_fits(&m->dp, rows);
}

/* Embedding and every layer of nseq x T rows through the per-op kernels;
 * leaves resid and out for the final add + norm. */
static int layers(mbd_mamba1_gpu *m, int nseq, int T, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, di = c->d_inner, N = c->d_state;
  const int64_t R = c->dt_rank;
  const mbd_dtype act = m->dtype;
  void *s = (void *)m->stream;
  int rc;
  if ((rc = mbd_mops_embed(s, M, (int)d, m->d_tok, m->dtype, m->emb, m->resid, err))) return rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_d *L = &m->layers[l];
    if ((rc = mbd_mops_add_rmsnorm(s, M, (int)d, 1, 0, m->resid, l ? m->out : NULL, L->norm,
                                   c->norm_eps, act, m->hn, err)))
      return rc;
    if ((rc = gemm(m, M, 2 * di, d, m->hn, L->in_w, L->in_b, m->xz, MBD_DTYPE_F32, err)))
      return rc;
    /* Decode at small batch: the conv runs inside x_proj and the scan (one
     * launch less, same bits); they advance the conv state, not xc. */
    const mbd_mops_conv conv = {c->d_conv, L->conv_w, L->conv_b,
                                m->conv_st + (int64_t)l * (c->d_conv - 1) * di, m->conv_slot};
    const int fused = mbd_mops_conv_fused(nseq, T, c->d_conv, (int)di, act);
    if (fused)
      rc = mbd_mops_conv_xproj(s, nseq, (int)di, &conv, m->xz, 2 * di, m->d_slots,
                               (int)(R + 2 * N), act, L->x_w, m->dbl, err);
    else if (!(rc = mbd_mops_conv_silu(s, nseq, T, (int)di, c->d_conv, m->xz, 2 * di, L->conv_w,
                                       L->conv_b, conv.state, m->conv_slot, m->d_slots, m->xc,
                                       act, act == MBD_DTYPE_F32 ? NULL : m->xc_act, err)))
      rc = mbd_mops_xproj(s, M, (int)di, (int)(R + 2 * N), act, m->xc_act, L->x_w, m->dbl, err);
    if (rc) return rc;
    /* the layer's SSM state: f32, or bf16 on a state=bf16 route */
    void *ssm = (char *)m->ssm_st + (size_t)(l * di * N) * (size_t)m->ssm_es;
    if (m->ssm_es == 2)
      rc = mbd_mops_scan_bf16state(s, nseq, T, (int)di, (int)N, (int)R, m->xc, m->dbl, m->dtype,
                                   L->dt_w, L->dt_b, L->A, L->D, m->xz, 2 * di, di, ssm,
                                   m->ssm_slot, m->d_slots, fused ? &conv : NULL, act, m->y,
                                   err);
    else
      rc = mbd_mops_scan(s, nseq, T, (int)di, (int)N, (int)R, m->xc, m->dbl, m->dtype, L->dt_w,
                         L->dt_b, L->A, L->D, m->xz, 2 * di, di, (float *)ssm, m->ssm_slot,
                         m->d_slots, fused ? &conv : NULL, act, m->y, err);
    if (rc) return rc;
    if ((rc = gemm(m, M, d, di, m->y, L->out_w, L->out_b, m->out, MBD_DTYPE_F32, err)))
      return rc;
  }
  return 0;
}

/* Runs nseq x T rows (tokens in d_tok, slots in d_slots; from_staging: a
 * persistent decode takes them from the pinned staging h_tok, h_slots and
 * moves the sampling's inputs up) through the model, advancing the slots'
 * states. Logits: 0 none; 1 each sequence's last row ([nseq, V]); 2 every row
 * ([nseq * T, V]); into m->logits. Enqueue only. */
static int forward(mbd_mamba1_gpu *m, int nseq, int T, int which, int from_staging,
                   mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, V = c->vocab_size;
  const mbd_dtype act = m->dtype;
  void *s = (void *)m->stream;
  int rc;
  const int persistent = T == 1 && mbd_mamba1_gpu_persistent(m, nseq);
  if (persistent) {
    /* small decode batches: every layer and the final add + norm in one
     * persistent launch, same bits */
    mbd_error poisoned;
    if (mbd_gpu_ctx_unusable(m->ctx, &poisoned)) { /* as mbd_gpu_gemm would refuse */
      if (err) *err = poisoned;
      return poisoned.code;
    }
    const mbd_dp_side side = {{m->h_temp, m->h_seed, m->h_step},
                              {m->d_temp, m->d_seed, m->d_step},
                              {(size_t)nseq * 4, (size_t)nseq * 8, (size_t)nseq * 8}};
    if ((rc = from_staging
                  ? mbd_dp_decode(s, &m->dp, nseq, m->h_tok, m->h_slots, &side, m->dp_trace, err)
                  : mbd_dp_decode(s, &m->dp, nseq, m->d_tok, m->d_slots, NULL, m->dp_trace,
                                  err)))
      return rc;
  } else if ((rc = layers(m, nseq, T, err))) {
    return rc;
  }
  step_mark(m, 2);
  if (which == 0) return 0;
  const int64_t rows = which == 1 ? nseq : M;
  if (!persistent && /* the persistent launch ends with it */
      (rc = mbd_mops_add_rmsnorm(s, rows, (int)d, which == 1 ? T : 1, which == 1 ? T - 1 : 0,
                                 m->resid, m->out, m->norm_f, c->norm_eps, act, m->hn, err)))
    return rc;
  step_mark(m, 3);
  return gemm(m, rows, V, d, m->hn, m->head, NULL, m->logits, MBD_DTYPE_F32, err);
}

/* Host checks shared by prefill and step: token range, slot range, distinct. */
static int check_batch(mbd_mamba1_gpu *m, int nseq, const int32_t *slots, int64_t ntok,
                       const int32_t *tokens, mbd_error *err) {
  for (int64_t i = 0; i < ntok; i++)
    if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
      return mbd_error_set(err, MBD_E_INVALID, "token %lld is %d, outside 0..%d", (long long)i,
                           tokens[i], m->cfg.vocab_size - 1);
  if (++m->gen == 0) {
    memset(m->stamp, 0, (size_t)m->nslots * sizeof(uint32_t));
    m->gen = 1;
  }
  for (int b = 0; b < nseq; b++) {
    int rc = mbd_m1g_check_slot(m, slots[b], err);
    if (rc) return rc;
    if (m->stamp[slots[b]] == m->gen)
      return mbd_error_set(err, MBD_E_INVALID, "state slot %d appears twice in one batch",
                           slots[b]);
    m->stamp[slots[b]] = m->gen;
  }
  return 0;
}

extern "C" int mbd_mamba1_gpu_prefill(mbd_mamba1_gpu *m, int nseq, int T, const int32_t *tokens,
                                      const int32_t *slots, mbd_mamba1_gpu_logits which,
                                      float *logits, mbd_error *err) {
  if (nseq < 0 || T < 0 || (which != MBD_MAMBA1_GPU_LOGITS_NONE && !logits))
    return mbd_error_set(err, MBD_E_INVALID, "prefill: negative sizes or no logits buffer");
  if (nseq == 0 || T == 0) return 0;
  int rc = check_batch(m, nseq, slots, (int64_t)nseq * T, tokens, err);
  if (rc) return rc;
  const size_t V = (size_t)m->cfg.vocab_size;
  const int sg = nseq < m->max_rows ? nseq : m->max_rows;
  const int Tc = m->max_rows / sg > 0 ? m->max_rows / sg : 1;
  for (int s0 = 0; s0 < nseq; s0 += sg) {
    const int ns = nseq - s0 < sg ? nseq - s0 : sg;
    memcpy(m->h_slots, slots + s0, (size_t)ns * 4);
    MBD_GPU_CHECK(cudaMemcpyAsync(m->d_slots, m->h_slots, (size_t)ns * 4,
                                  cudaMemcpyHostToDevice, m->stream),
                  err);
    for (int t0 = 0; t0 < T; t0 += Tc) {
      const int tc = T - t0 < Tc ? T - t0 : Tc;
      const int last = t0 + tc == T;
      /* The staging buffer is reused: wait for the previous chunk's upload. */
      MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
      for (int b = 0; b < ns; b++)
        memcpy(m->h_tok + (size_t)b * tc, tokens + (size_t)(s0 + b) * T + t0, (size_t)tc * 4);
      MBD_GPU_CHECK(cudaMemcpyAsync(m->d_tok, m->h_tok, (size_t)ns * tc * 4,
                                    cudaMemcpyHostToDevice, m->stream),
                    err);
      int w = which == MBD_MAMBA1_GPU_LOGITS_ALL ? 2
              : (which == MBD_MAMBA1_GPU_LOGITS_LAST && last) ? 1
                                                               : 0;
      if ((rc = forward(m, ns, tc, w, 0, err))) return rc;
      if (w == 2)
        MBD_GPU_CHECK(cudaMemcpy2DAsync(logits + ((size_t)s0 * T + t0) * V, (size_t)T * V * 4,
                                        m->logits, (size_t)tc * V * 4, (size_t)tc * V * 4,
                                        (size_t)ns, cudaMemcpyDefault, m->stream),
                      err);
      else if (w == 1)
        MBD_GPU_CHECK(cudaMemcpyAsync(logits + (size_t)s0 * V, m->logits, (size_t)ns * V * 4,
                                      cudaMemcpyDefault, m->stream),
                      err);
    }
  }
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

/* One decode step of `rows` rows: the staged inputs (up in one copy for the
 * per-op path), the model, the pick into pinned h_next; a graph replays all
 * of it. */
static int step_body_marked(mbd_mamba1_gpu *m, int rows, mbd_error *err) {
  /* The pinned staging is mapped (unified addressing): the persistent decode
   * reads its tokens and slots from it directly and copies the rest up for
   * the sampling while the layers run; the picks go straight into h_next. A
   * copy node costs more than reading the sampling's inputs over PCIe
   * (docs/benchmarks.md); the per-op layers read the tokens and slots many
   * times and get one upload. */
  const int direct = mbd_mamba1_gpu_persistent(m, rows);
  step_mark(m, 0);
  if (!direct)
    MBD_GPU_CHECK(cudaMemcpyAsync(m->d_in, m->h_in, m->in_bytes, cudaMemcpyHostToDevice,
                                  m->stream),
                  err);
  step_mark(m, 1);
  int rc = forward(m, rows, 1, 2, direct, err);
  if (rc) return rc;
  step_mark(m, 4);
  if ((rc = mbd_mops_sample((void *)m->stream, rows, m->cfg.vocab_size, m->logits,
                            m->cfg.vocab_size, m->d_temp, m->d_seed, m->d_step, m->sample_work,
                            m->h_next, err)))
    return rc;
  step_mark(m, 5);
  return 0;
}

static int step_body(mbd_mamba1_gpu *m, int rows, mbd_error *err) {
  /* (persistent rows only: the per-op path's PDL launches admit no event
   * nodes between them) */
  m->marking = m->step_ev[0] && mbd_mamba1_gpu_persistent(m, rows);
  int rc = step_body_marked(m, rows, err);
  m->marking = 0;
  return rc;
}

/* step_body through mbd_gpu_graph_run */
typedef struct step_call {
  mbd_mamba1_gpu *m;
  int rows;
} step_call;
static int step_call_run(void *arg, mbd_error *err) {
  const step_call *c = (const step_call *)arg;
  return step_body(c->m, c->rows, err);
}

extern "C" int mbd_mamba1_gpu_step(mbd_mamba1_gpu *m, int n, const int32_t *tokens,
                                   const int32_t *slots, const mbd_mamba1_gpu_pick *picks,
                                   int32_t *next, float *logits, mbd_error *err) {
  int rc = mbd_mamba1_gpu_step_launch(m, n, tokens, slots, picks, logits, logits ? n : 0, err);
  return rc ? rc : mbd_mamba1_gpu_step_wait(m, next, err);
}

extern "C" int mbd_mamba1_gpu_step_launch(mbd_mamba1_gpu *m, int n, const int32_t *tokens,
                                          const int32_t *slots, const mbd_mamba1_gpu_pick *picks,
                                          float *logits, int nlogits, mbd_error *err) {
  if (m->pending)
    return mbd_error_set(err, MBD_E_STATE, "step: the last launched step was not waited for");
  if (nlogits < 0 || nlogits > n || (nlogits && !logits))
    return mbd_error_set(err, MBD_E_INVALID, "step: %d logits rows of a batch of %d", nlogits, n);
  if (n < 1 || n > m->max_batch)
    return mbd_error_set(err, MBD_E_INVALID, "step: batch %d outside 1..%d", n, m->max_batch);
  int rc = check_batch(m, n, slots, n, tokens, err);
  if (rc) return rc;
  int bucket = 1, bi = 0;
  while (bucket < n) bucket <<= 1, bi++;
  const int rows = m->use_graphs ? bucket : n;
  /* Pinned staging may still feed the previous step's copies only if that
   * step failed midway; the stream is idle otherwise. */
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  for (int i = 0; i < rows; i++) {
    const int real = i < n;
    m->h_tok[i] = real ? tokens[i] : 0;
    m->h_slots[i] = real ? slots[i] : (int32_t)m->nslots; /* padding: scratch slot */
    m->h_temp[i] = real && picks ? picks[i].temperature : 0.0f;
    m->h_seed[i] = real && picks ? picks[i].seed : 0;
    m->h_step[i] = real && picks ? picks[i].step : 0;
  }
  cudaStream_t s = m->stream;
  char what[48] = ""; /* named only for a capture: the replay path formats nothing */
  if (m->use_graphs && !m->graphs[bi])
    snprintf(what, sizeof what, "the batch-%d decode graph", rows);
  step_call call = {m, rows};
  if ((rc = mbd_gpu_graph_run(m->ctx, m->use_graphs, &m->graphs[bi], step_call_run, &call, what,
                              err)))
    return rc;
  if (nlogits)
    MBD_GPU_CHECK(cudaMemcpyAsync(logits, m->logits, (size_t)nlogits * m->cfg.vocab_size * 4,
                                  cudaMemcpyDeviceToHost, s),
                  err);
  m->pending = n;
  return 0;
}

extern "C" int mbd_mamba1_gpu_step_wait(mbd_mamba1_gpu *m, int32_t *next, mbd_error *err) {
  const int n = m->pending;
  if (!n) return mbd_error_set(err, MBD_E_STATE, "step: no launched step to wait for");
  m->pending = 0;
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  if (next) memcpy(next, m->h_next, (size_t)n * 4);
  return 0;
}

void mbd_mamba1_gpu_set_graphs(mbd_mamba1_gpu *m, int on) {
  if (!on)
    for (int i = 0; i < MBD_M1G_MAX_BUCKETS; i++) mbd_gpu_graph_destroy(&m->graphs[i]);
  m->use_graphs = on;
}
