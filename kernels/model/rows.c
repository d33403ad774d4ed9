/* The prefill and step driver shared by the CPU models (see rows.h). */
#include "kernels/model/rows.h"

#include <stdlib.h>
#include <string.h>

void mbd_rows_batch_free(mbd_rows_batch *b) {
  free(b->last);
  free(b->seg);
  free(b->step_tok);
  free(b->step_len);
  memset(b, 0, sizeof(*b));
}

static int ensure_batch(mbd_rows_batch *B, int batch, int64_t d, mbd_error *err) {
  if (batch <= B->cap) return MBD_OK;
  float *last = realloc(B->last, (size_t)batch * (size_t)d * sizeof(float));
  if (!last) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory for batch %d", batch);
  B->last = last;
  int64_t *seg = realloc(B->seg, (size_t)batch * 4 * sizeof(int64_t));
  if (!seg) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory for batch %d", batch);
  B->seg = seg;
  const int32_t **st = realloc(B->step_tok, (size_t)batch * sizeof(*st));
  if (!st) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory for batch %d", batch);
  B->step_tok = st;
  int64_t *sl = realloc(B->step_len, (size_t)batch * sizeof(*sl));
  if (!sl) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory for batch %d", batch);
  B->step_len = sl;
  B->cap = batch;
  return MBD_OK;
}

/* Checks the call's states and tokens before anything changes. */
static int check_call(const mbd_rows_model *r, void *const *states, int batch,
                      const int32_t *const *tokens, const int64_t *lens, mbd_error *err) {
  for (int b = 0; b < batch; b++) {
    const mbd_seq_state *s = states[b];
    if (!s || !mbd_seq_state_fits(r->state, s))
      return mbd_error_set(err, MBD_E_SHAPE, "prefill: state %d is missing or for another model",
                           b);
    for (int b2 = 0; b2 < b; b2++)
      if (states[b2] == s)
        return mbd_error_set(err, MBD_E_INVALID, "prefill: sequences %d and %d share a state", b2,
                             b);
    if (lens[b] < 0 || (lens[b] > 0 && !tokens[b]))
      return mbd_error_set(err, MBD_E_INVALID, "prefill: sequence %d has no tokens", b);
    for (int64_t t = 0; t < lens[b]; t++)
      if (tokens[b][t] < 0 || tokens[b][t] >= r->V)
        return mbd_error_set(err, MBD_E_INVALID,
                             "prefill: sequence %d position %lld: token %d outside vocabulary "
                             "[0, %lld)",
                             b, (long long)t, tokens[b][t], (long long)r->V);
  }
  return MBD_OK;
}

/* ALL: the logits of the chunk's segments, merging segments whose output rows
 * are contiguous (one ends its sequence, the next is the following sequence
 * from t = 0) into one GEMM. */
static int chunk_logits_all(const mbd_rows_model *r, int64_t nseg, const int64_t *lens, int g0,
                            int64_t out_base, float *logits, mbd_error *err) {
  int64_t d = r->d, V = r->V;
  const int64_t *S = r->batch->seg;
  int64_t i = 0;
  while (i < nseg) {
    int64_t j = i + 1;
    while (j < nseg && S[4 * (j - 1) + 3] + S[4 * (j - 1) + 2] == lens[S[4 * (j - 1)]] &&
           S[4 * j + 3] == 0 && S[4 * j] == S[4 * (j - 1)] + 1)
      j++;
    const int64_t *si = S + 4 * i, *sj = S + 4 * (j - 1);
    int64_t orow = out_base + si[3];
    for (int64_t b = g0; b < si[0]; b++) orow += lens[b];
    int64_t nrows = sj[1] + sj[2] - si[1];
    int rc = mbd_cpu_gemm_packed(r->ctx, nrows, r->xn + si[1] * d, d, r->head, NULL,
                                 logits + orow * V, V, err);
    if (rc) return rc;
    i = j;
  }
  return MBD_OK;
}

/* LAST: one GEMM over the last rows of the sequences that had tokens. */
static int logits_last(const mbd_rows_model *r, int batch, const int64_t *lens, float *logits,
                       mbd_error *err) {
  int64_t d = r->d, V = r->V;
  float *last = r->batch->last;
  int64_t n = 0;
  for (int b = 0; b < batch; b++) {
    if (lens[b] == 0) continue;
    if (n != b) memmove(last + n * d, last + (int64_t)b * d, (size_t)d * sizeof(float));
    n++;
  }
  if (n == batch) return mbd_cpu_gemm_packed(r->ctx, n, last, d, r->head, NULL, logits, V, err);
  for (int b = 0, k = 0; b < batch; b++) {
    if (lens[b] == 0) continue;
    int rc = mbd_cpu_gemm_packed(r->ctx, 1, last + (int64_t)(k++) * d, d, r->head, NULL,
                                 logits + (int64_t)b * V, V, err);
    if (rc) return rc;
  }
  return MBD_OK;
}

int mbd_rows_prefill(const mbd_rows_model *r, void *const *states, int batch,
                     const int32_t *const *tokens, const int64_t *lens, mbd_logits_sel which,
                     float *logits, mbd_error *err) {
  if (!r || !r->model || batch < 0 || (batch > 0 && (!states || !tokens || !lens)))
    return mbd_error_set(err, MBD_E_INVALID, "prefill: NULL model/states/tokens/lens");
  if (which != MBD_LOGITS_NONE && which != MBD_LOGITS_LAST && which != MBD_LOGITS_ALL)
    return mbd_error_set(err, MBD_E_INVALID, "prefill: bad logits selector %d", (int)which);
  if (which != MBD_LOGITS_NONE && !logits && batch > 0)
    return mbd_error_set(err, MBD_E_INVALID, "prefill: logits requested but no buffer given");
  int rc = check_call(r, states, batch, tokens, lens, err);
  if (rc || (rc = ensure_batch(r->batch, batch, r->d, err))) return rc;
  int64_t d = r->d, max_rows = r->max_rows;
  int64_t *seg = r->batch->seg;
  int64_t out_base = 0; /* ALL: output row of the group's first sequence */
  for (int g0 = 0; g0 < batch; g0 += (int)max_rows) {
    int gn = batch - g0 < max_rows ? batch - g0 : (int)max_rows;
    int64_t tw = max_rows / gn;
    int64_t glen = 0;
    for (int b = g0; b < g0 + gn; b++) glen = lens[b] > glen ? lens[b] : glen;
    for (int64_t t0 = 0; t0 < glen; t0 += tw) {
      int64_t nseg = 0, rows = 0;
      for (int b = g0; b < g0 + gn; b++) {
        int64_t n = lens[b] - t0 < tw ? lens[b] - t0 : tw;
        if (n <= 0) continue;
        int64_t *sg = seg + 4 * nseg++;
        sg[0] = b;
        sg[1] = rows;
        sg[2] = n;
        sg[3] = t0;
        for (int64_t t = 0; t < n; t++)
          mbd_cpu_wpack_row(r->embed, tokens[b][t0 + t], r->resid + (rows + t) * d);
        rows += n;
      }
      if ((rc = r->forward(r->model, states, seg, nseg, rows, err))) return rc;
      for (int64_t i = 0; i < nseg; i++) {
        const int64_t *sg = seg + 4 * i;
        int b = (int)sg[0];
        ((mbd_seq_state *)states[b])->pos += sg[2];
        if (which == MBD_LOGITS_LAST && sg[3] + sg[2] == lens[b])
          memcpy(r->batch->last + (size_t)b * (size_t)d, r->xn + (sg[1] + sg[2] - 1) * d,
                 (size_t)d * sizeof(float));
      }
      if (which == MBD_LOGITS_ALL &&
          (rc = chunk_logits_all(r, nseg, lens, g0, out_base, logits, err)))
        return rc;
    }
    for (int b = g0; b < g0 + gn; b++) out_base += lens[b];
  }
  if (which == MBD_LOGITS_LAST) return logits_last(r, batch, lens, logits, err);
  return MBD_OK;
}

int mbd_rows_step(const mbd_rows_model *r, void *const *states, int batch, const int32_t *tokens,
                  float *logits, mbd_error *err) {
  if (!r || !r->model || batch < 0 || (batch > 0 && !tokens))
    return mbd_error_set(err, MBD_E_INVALID, "step: NULL model or tokens");
  if (batch == 0) return MBD_OK;
  int rc = ensure_batch(r->batch, batch, r->d, err);
  if (rc) return rc;
  for (int b = 0; b < batch; b++) {
    r->batch->step_tok[b] = tokens + b;
    r->batch->step_len[b] = 1;
  }
  return mbd_rows_prefill(r, states, batch, r->batch->step_tok, r->batch->step_len,
                          logits ? MBD_LOGITS_LAST : MBD_LOGITS_NONE, logits, err);
}
