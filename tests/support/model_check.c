/* The CPU model tests' shared checks (see model_check.h). */
#include "support/model_check.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

double mc_max_abs(const float *x, size_t n) {
  double mx = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(x[i]) > mx) mx = fabs(x[i]);
  return mx;
}

double mc_max_err(const float *a, const float *b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > e) e = d;
  }
  return e;
}

double mc_rel_err(const float *got, const float *ref, int V) {
  return mc_max_err(got, ref, (size_t)V) / mc_max_abs(ref, (size_t)V);
}

int mc_argmax(const float *x, int V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (x[v] > x[best]) best = v;
  return best;
}

double mc_check_positions(const float *got, const float *ref, int npos, int V, double tol,
                          const char *what) {
  double worst = 0;
  for (int p = 0; p < npos; p++) {
    double e = mc_rel_err(got + (size_t)p * V, ref + (size_t)p * V, V);
    if (e > worst) worst = e;
    if (e > tol) fail_msg("%s position %d: rel err %.3g > %.3g", what, p, e, tol);
  }
  return worst;
}

void *mc_state_new(const mbd_cpu_model_ops *ops, const void *m) {
  void *s = NULL;
  mbd_error err = {0};
  if (ops->state_new(m, &s, &err)) fail_msg("state: %s", err.msg);
  return s;
}

uint8_t *mc_state_image(const mbd_cpu_model_ops *ops, const void *s, size_t *n) {
  *n = ops->state_bytes(s);
  uint8_t *buf = malloc(*n);
  mbd_error err = {0};
  if (!buf) fail_msg("state image: out of memory for %zu bytes", *n);
  if (ops->state_save(s, buf, *n, &err)) fail_msg("state image: %s", err.msg);
  return buf;
}

void mc_check_state(const mbd_cpu_model_ops *ops, const void *s, const uint8_t *want,
                    size_t want_len, const char *what) {
  size_t n = 0;
  uint8_t *img = mc_state_image(ops, s, &n);
  if (n != want_len) fail_msg("%s: state image of %zu bytes, want %zu", what, n, want_len);
  if (memcmp(img, want, n)) fail_msg("%s: state differs", what);
  free(img);
}

static void finish(const mbd_cpu_model_ops *ops, void *s, uint8_t **img, size_t *n) {
  if (img) *img = mc_state_image(ops, s, n);
  ops->state_free(s);
}

void mc_run_alone(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                  float *logits, uint8_t **img, size_t *n) {
  finish(ops, mc_prefill_then_steps(ops, m, tok, len, len, 0, logits), img, n);
}

void mc_run_steps(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                  float *logits, uint8_t **img, size_t *n) {
  finish(ops, mc_prefill_then_steps(ops, m, tok, 0, len, 0, logits), img, n);
}

void mc_check_alone(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                    const float *want, const uint8_t *want_state, size_t want_len,
                    const char *what) {
  size_t n = (size_t)len * ops->vocab(m);
  float *got = malloc(n * sizeof *got);
  assert_non_null(got);
  void *s = mc_prefill_then_steps(ops, m, tok, len, len, 0, got);
  if (memcmp(got, want, n * sizeof *got)) fail_msg("%s: logits differ", what);
  if (want_state) mc_check_state(ops, s, want_state, want_len, what);
  ops->state_free(s);
  free(got);
}

void *mc_prefill_then_steps(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok,
                            int64_t k, int64_t len, int64_t chunk, float *logits) {
  void *s = mc_state_new(ops, m);
  mbd_error err = {0};
  int64_t V = ops->vocab(m);
  if (chunk <= 0) chunk = k;
  for (int64_t t0 = 0; t0 < k; t0 += chunk) {
    int64_t n = k - t0 < chunk ? k - t0 : chunk;
    const int32_t *p = tok + t0;
    if (ops->prefill(m, &s, 1, &p, &n, MBD_LOGITS_ALL, logits + t0 * V, &err))
      fail_msg("prefill: %s", err.msg);
  }
  for (int64_t t = k; t < len; t++)
    if (ops->step(m, &s, 1, tok + t, logits + t * V, &err)) fail_msg("step: %s", err.msg);
  return s;
}

void mc_prefill_prompts(const mbd_cpu_model_ops *ops, void *m, void *const *states, int B,
                        const int32_t *ids, int T, float *logits) {
  const int32_t **tp = calloc((size_t)B, sizeof *tp);
  int64_t *lens = calloc((size_t)B, sizeof *lens);
  assert_true(tp && lens);
  for (int b = 0; b < B; b++) {
    tp[b] = ids + (size_t)b * T;
    lens[b] = T;
  }
  mbd_error err = {0};
  if (ops->prefill(m, states, B, tp, lens, MBD_LOGITS_ALL, logits, &err))
    fail_msg("prefill: %s", err.msg);
  free(tp);
  free(lens);
}

void mc_decode_prompts(const mbd_cpu_model_ops *ops, void *m, void *const *states, int B,
                       const int32_t *ids, int T, float *logits) {
  int64_t V = ops->vocab(m);
  int32_t *tok = malloc((size_t)B * sizeof *tok);
  float *row = malloc((size_t)B * V * sizeof *row);
  assert_true(tok && row);
  mbd_error err = {0};
  for (int t = 0; t < T; t++) {
    for (int b = 0; b < B; b++) tok[b] = ids[(size_t)b * T + t];
    if (ops->step(m, states, B, tok, row, &err)) fail_msg("step: %s", err.msg);
    for (int b = 0; b < B; b++)
      memcpy(logits + ((size_t)b * T + t) * V, row + (size_t)b * V, (size_t)V * sizeof *row);
  }
  free(tok);
  free(row);
}

void mc_check_batch(const mbd_cpu_model_ops *ops, void *m, const mc_seq *seqs, int n, int step,
                    const char *what) {
  int64_t V = ops->vocab(m), total = 0;
  void **st = calloc((size_t)n, sizeof *st);
  const int32_t **tp = calloc((size_t)n, sizeof *tp);
  int64_t *lens = calloc((size_t)n, sizeof *lens);
  int32_t *next = calloc((size_t)n, sizeof *next);
  assert_true(st && tp && lens && next);
  for (int i = 0; i < n; i++) {
    st[i] = mc_state_new(ops, m);
    tp[i] = seqs[i].tok;
    lens[i] = seqs[i].len;
    next[i] = seqs[i].next;
    total += seqs[i].len;
  }
  float *out = malloc((size_t)total * V * sizeof *out);
  float *rows = malloc((size_t)n * V * sizeof *rows);
  assert_true(out && rows);
  mbd_error err = {0};
  if (ops->prefill(m, st, n, tp, lens, MBD_LOGITS_ALL, out, &err))
    fail_msg("prefill: %s", err.msg);
  if (step && ops->step(m, st, n, next, rows, &err)) fail_msg("step: %s", err.msg);
  char where[256];
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    snprintf(where, sizeof where, "%s slot %d of %d", what, i, n);
    if (seqs[i].logits &&
        memcmp(out + off * V, seqs[i].logits, (size_t)seqs[i].len * V * sizeof *out))
      fail_msg("%s: logits differ from alone", where);
    if (seqs[i].logits && step &&
        memcmp(rows + (size_t)i * V, seqs[i].next_logits, (size_t)V * sizeof *rows))
      fail_msg("%s: step logits differ from alone", where);
    if (seqs[i].state) mc_check_state(ops, st[i], seqs[i].state, seqs[i].state_len, where);
    off += seqs[i].len;
    ops->state_free(st[i]);
  }
  free(out);
  free(rows);
  free(st);
  free(tp);
  free(lens);
  free(next);
}
