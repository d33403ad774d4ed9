/* A fake compute backend for the worker's unit tests (see fake_backend.h). */
#include "support/fake_backend.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct fb_model {
  int64_t vocab;
} fb_model;

uint64_t fb_mix(uint64_t h, int64_t tok) { return h * 1000003u + (uint64_t)tok + 7u; }

void fb_logits(uint64_t h, int64_t V, float *out) {
  int64_t peak = (int64_t)(h % (uint64_t)V);
  for (int64_t v = 0; v < V; v++) out[v] = -(float)((v - peak + V) % V);
}

static void fb_destroy(mbd_backend *b) {
  free(b->impl);
  free(b);
}

static void fb_route(mbd_backend *b, mbd_route_identity *out) {
  (void)b;
  memset(out, 0, sizeof *out);
  out->mode = MBD_GEMM_DETERMINISTIC;
  out->policy = MBD_POLICY_F32;
  out->backend = MBD_BACKEND_CPU;
  snprintf(out->isa, sizeof out->isa, "fake");
  snprintf(out->device_name, sizeof out->device_name, "fake");
  out->state_capacity = 8;
}

static void fb_model_destroy(mbd_backend *b, mbd_bmodel *m) {
  (void)b;
  free(m);
}

static int64_t fb_vocab(const mbd_bmodel *m) { return ((const fb_model *)(const void *)m)->vocab; }

static int fb_state_new(mbd_backend *b, mbd_bmodel *m, mbd_bstate **out, mbd_error *err) {
  (void)m;
  fb_backend *f = b->impl;
  fb_state *s = calloc(1, sizeof *s);
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "fake: out of memory");
  s->id = f->next_id++;
  f->live_states++;
  *out = (mbd_bstate *)(void *)s;
  return MBD_OK;
}

static void fb_state_free(mbd_backend *b, mbd_bstate *s) {
  fb_backend *f = b->impl;
  if (s) f->live_states--;
  free(s);
}

/* Logs the call, fails it when it is fail_call, else advances every row. */
static int step_common(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                       const int64_t *tokens, int64_t n, int64_t *next, float *logits, bool greedy,
                       mbd_error *err) {
  fb_backend *f = b->impl;
  int64_t V = fb_vocab(m);
  assert_true(f->ncalls < FB_LOG_MAX);
  assert_true(n >= 1 && n <= FB_ROWS_MAX);
  fb_call *c = &f->log[f->ncalls++];
  c->model = (int)V;
  c->n = n;
  c->logits = logits != NULL;
  c->greedy = greedy;
  for (int64_t i = 0; i < n; i++) {
    c->ids[i] = ((fb_state *)(void *)states[i])->id;
    c->tokens[i] = tokens[i];
  }
  if (f->fail_call == f->ncalls) /* before any state changes, like a failed launch */
    return mbd_error_set(err, MBD_E_DEVICE, "fake: device lost in call %d", f->ncalls);
  for (int64_t i = 0; i < n; i++) {
    fb_state *s = (fb_state *)(void *)states[i];
    s->h = fb_mix(s->h, tokens[i]);
    s->n++;
    if (logits) fb_logits(s->h, V, logits + i * V);
    if (next) next[i] = (int64_t)(s->h % (uint64_t)V); /* the argmax of fb_logits */
  }
  return MBD_OK;
}

static int fb_step(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, const int64_t *tokens,
                   int64_t n, float *logits, mbd_error *err) {
  assert_non_null(logits);
  return step_common(b, m, states, tokens, n, NULL, logits, false, err);
}

int fb_step_greedy(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                   const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                   mbd_error *err) {
  return step_common(b, m, states, tokens, n, next, logits, true, err);
}

size_t fb_state_bytes(const mbd_bstate *s) {
  (void)s;
  return sizeof(fb_state);
}

int fb_state_save(const mbd_bstate *s, void *dst, size_t cap, mbd_error *err) {
  (void)err;
  assert_int_equal(cap, sizeof(fb_state));
  memcpy(dst, s, sizeof(fb_state));
  return MBD_OK;
}

const mbd_backend_ops fb_ops = {
    .name = "fake",
    .destroy = fb_destroy,
    .route = fb_route,
    .model_destroy = fb_model_destroy,
    .model_vocab = fb_vocab,
    .state_new = fb_state_new,
    .state_free = fb_state_free,
    .step = fb_step,
};

mbd_backend *fb_backend_new(const mbd_backend_ops *ops, fb_backend **impl) {
  mbd_backend *be = calloc(1, sizeof *be);
  assert_non_null(be);
  *impl = calloc(1, sizeof **impl);
  assert_non_null(*impl);
  be->ops = ops;
  be->impl = *impl;
  return be;
}

mbd_bmodel *fb_model_new(int64_t vocab) {
  fb_model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->vocab = vocab;
  return (mbd_bmodel *)(void *)m;
}
