/* The worker's checkpoints without sockets: a fake backend whose greedy
 * tokens are picked "on the device" (step_greedy), a fake clock and a send
 * callback that records. Checks the rule the broker relies on (a CHECKPOINT
 * covers only tokens already reported in replies before it, unsent ones
 * flushed as a PARTIAL), that a device-picked greedy loop's checkpoint
 * carries the current logits, GENERATE resume (continues at its index; an
 * already complete loop is answered at once) and the SIGTERM hand-over (a
 * checkpoint, no reply). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "worker/checkpoint.h"
#include "worker/scheduler.h"
#include "worker/state.h"

#define V 16
#define OUT_MAX 256

/* A state: the hash of its tokens and how many it consumed. */
typedef struct fstate {
  uint64_t h;
  int64_t n;
} fstate;

typedef struct fmodel {
  int64_t vocab;
} fmodel;

static uint64_t mix(uint64_t h, int64_t tok) { return h * 1000003u + (uint64_t)tok + 7u; }

static void logits_of(uint64_t h, float *out) {
  int64_t peak = (int64_t)(h % V);
  for (int64_t v = 0; v < V; v++) out[v] = -(float)((v - peak + V) % V);
}

static void f_destroy(mbd_backend *b) { free(b); }
static void f_route(mbd_backend *b, mbd_route_identity *out) {
  (void)b;
  memset(out, 0, sizeof *out);
  out->policy = MBD_POLICY_F32;
  snprintf(out->isa, sizeof out->isa, "fake");
  snprintf(out->device_name, sizeof out->device_name, "fake");
  out->state_capacity = 4;
}
static void f_model_destroy(mbd_backend *b, mbd_bmodel *m) {
  (void)b;
  free(m);
}
static int64_t f_vocab(const mbd_bmodel *m) { return ((const fmodel *)(const void *)m)->vocab; }
static int f_state_new(mbd_backend *b, mbd_bmodel *m, mbd_bstate **out, mbd_error *err) {
  (void)b;
  (void)m;
  (void)err;
  *out = calloc(1, sizeof(fstate));
  return *out ? MBD_OK : MBD_E_NOMEM;
}
static void f_state_free(mbd_backend *b, mbd_bstate *s) {
  (void)b;
  free(s);
}
static size_t f_state_bytes(const mbd_bstate *s) {
  (void)s;
  return sizeof(fstate);
}
static int f_state_save(const mbd_bstate *s, void *dst, size_t cap, mbd_error *err) {
  (void)err;
  assert_int_equal(cap, sizeof(fstate));
  memcpy(dst, s, sizeof(fstate));
  return MBD_OK;
}
static int f_step_greedy(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                         const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                         mbd_error *err) {
  (void)b;
  (void)m;
  (void)err;
  for (int64_t i = 0; i < n; i++) {
    fstate *s = (fstate *)(void *)states[i];
    s->h = mix(s->h, tokens[i]);
    s->n++;
    if (logits) logits_of(s->h, logits + i * V);
    if (next) next[i] = (int64_t)(s->h % V); /* the argmax of logits_of */
  }
  return MBD_OK;
}
static int f_step(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, const int64_t *tokens,
                  int64_t n, float *logits, mbd_error *err) {
  return f_step_greedy(b, m, states, tokens, n, NULL, logits, err);
}

static const mbd_backend_ops f_ops = {
    .name = "fake",
    .destroy = f_destroy,
    .route = f_route,
    .model_destroy = f_model_destroy,
    .model_vocab = f_vocab,
    .state_new = f_state_new,
    .state_free = f_state_free,
    .state_bytes = f_state_bytes,
    .state_save = f_state_save,
    .step = f_step,
    .step_greedy = f_step_greedy,
};

typedef struct fx {
  double now;
  mbd_msg *out[OUT_MAX];
  int nout;
  mbd_wstate *st;
} fx;

static double f_now(void *ctx) { return ((fx *)ctx)->now; }
static void rec(void *ctx, mbd_msg **m) {
  fx *x = ctx;
  assert_true(x->nout < OUT_MAX);
  x->out[x->nout++] = *m;
  *m = NULL;
}
static void clear_out(fx *x) {
  for (int i = 0; i < x->nout; i++) mbd_msg_destroy(&x->out[i]);
  x->nout = 0;
}

static void fx_init(fx *x, int ckpt_tokens) {
  memset(x, 0, sizeof *x);
  x->now = 10.0;
  mbd_worker_opts o;
  memset(&o, 0, sizeof o);
  snprintf(o.name, sizeof o.name, "w");
  o.capacity = o.sessions = 4;
  o.max_batch = 4;
  o.max_message_bytes = 1 << 20;
  o.checkpoint_tokens = ckpt_tokens;
  mbd_backend *be = calloc(1, sizeof *be);
  be->ops = &f_ops;
  assert_int_equal(mbd_wstate_new(&o, &be, f_now, x, rec, x, &x->st, NULL), 0);
  fmodel *m = calloc(1, sizeof *m);
  m->vocab = V;
  assert_int_equal(mbd_wstate_add_model(x->st, "m", "00", "", (mbd_bmodel *)(void *)m, NULL), 0);
}

/* A session that consumed token 3 in a STEP (so it has logits); replies cleared. */
static mbd_wsession *primed(fx *x) {
  mbd_wsession *s = NULL;
  assert_int_equal(mbd_wstate_session_new(x->st, 0, &s, NULL), 0);
  assert_int_equal(mbd_wsched_step(x->st, s, 1, 3, NULL, NULL), 0);
  mbd_wsched_tick(x->st);
  clear_out(x);
  return s;
}

static mbd_wreq greedy(int64_t max_tokens, int64_t partial_every) {
  mbd_wreq q;
  memset(&q, 0, sizeof q);
  q.cmd = MBD_CMD_GENERATE;
  q.max_tokens = max_tokens;
  q.top_p = 1.0;
  q.partial_every = partial_every;
  return q;
}

/* Token count of a PARTIAL/FINAL body. */
static int64_t ntokens(const mbd_msg *m) {
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  const msgpack_object *t = mbd_obj_get(mbd_body_root(body), "tokens");
  assert_non_null(t);
  int64_t n = t->via.array.size;
  mbd_body_destroy(&body);
  return n;
}

static void test_checkpoint_covers_reported_tokens(void **state) {
  (void)state;
  fx x;
  fx_init(&x, 4);
  primed(&x); /* 1 token consumed, not yet checkpointed (below the cadence) */
  mbd_wreq q = greedy(10, 3);
  mbd_wsession *s = mbd_wsession_at(x.st->sessions, 0);
  assert_int_equal(mbd_wsched_generate(x.st, s, 7, &q, NULL), 0);
  for (int i = 0; i < 12 && x.st->ngen; i++) mbd_wsched_tick(x.st);
  assert_int_equal(x.st->ngen, 0);
  int64_t reported = 1, nckpt = 0;
  for (int i = 0; i < x.nout; i++) {
    const mbd_msg *m = x.out[i];
    if (mbd_msg_cmd(m) == MBD_CMD_PARTIAL) reported += ntokens(m);
    if (mbd_msg_cmd(m) == MBD_CMD_FINAL) reported = 1 + ntokens(m);
    if (mbd_msg_cmd(m) != MBD_CMD_CHECKPOINT) continue;
    nckpt++;
    size_t len = 0;
    const uint8_t *blob = mbd_msg_payload(m, 0, &len);
    fstate fs;
    memcpy(&fs, blob + 256, sizeof fs);
    /* The state covers exactly the tokens reported before it... */
    assert_int_equal(fs.n, reported);
    /* ...and its logits are the state's, though greedy picks stay on the device. */
    uint32_t flags;
    memcpy(&flags, blob + 12, 4);
    assert_int_equal(flags & 1, 1);
    float want[V];
    logits_of(fs.h, want);
    assert_memory_equal(blob + 256 + sizeof fs, want, sizeof want);
  }
  /* 1 + 10 tokens, cadence 4: after tokens 4 and 8, and at the loop's end. */
  assert_int_equal(nckpt, 3);
  clear_out(&x);
  mbd_wstate_destroy(&x.st);
}

static void test_resume(void **state) {
  (void)state;
  fx x;
  fx_init(&x, 4);
  mbd_wsession *s = primed(&x);
  mbd_wreq q = greedy(5, 1);
  const int64_t done[3] = {9, 8, 7};
  assert_int_equal(mbd_wsched_generate_resume(x.st, s, 7, &q, done, 3, NULL), 0);
  for (int i = 0; i < 6 && x.st->ngen; i++) mbd_wsched_tick(x.st);
  int64_t partial = 0, final = -1;
  for (int i = 0; i < x.nout; i++) {
    if (mbd_msg_cmd(x.out[i]) == MBD_CMD_PARTIAL) partial += ntokens(x.out[i]);
    if (mbd_msg_cmd(x.out[i]) == MBD_CMD_FINAL) final = ntokens(x.out[i]);
  }
  assert_int_equal(partial, 1); /* only new tokens stream; the last comes in the FINAL */
  assert_int_equal(final, 5);   /* the FINAL lists all of them */
  clear_out(&x);
  /* A loop that already reached max_tokens is answered at once, stepping nothing. */
  const int64_t all[5] = {1, 2, 3, 4, 5};
  assert_int_equal(mbd_wsched_generate_resume(x.st, s, 8, &q, all, 5, NULL), 0);
  assert_int_equal(x.st->ngen, 0);
  assert_int_equal(x.nout, 1);
  assert_int_equal(mbd_msg_cmd(x.out[0]), MBD_CMD_FINAL);
  assert_int_equal(ntokens(x.out[0]), 5);
  clear_out(&x);
  mbd_wstate_destroy(&x.st);
}

/* Whether the recorded replies hold an ERROR / a CHECKPOINT. */
static void kinds(fx *x, bool *error, bool *ckpt) {
  *error = *ckpt = false;
  for (int i = 0; i < x->nout; i++) {
    *error |= mbd_msg_cmd(x->out[i]) == MBD_CMD_ERROR;
    *ckpt |= mbd_msg_cmd(x->out[i]) == MBD_CMD_CHECKPOINT;
  }
}

static void test_sigterm_hand_over(void **state) {
  (void)state;
  fx x;
  fx_init(&x, 100);
  mbd_wsession *s = primed(&x);
  /* A loop whose logits are current (a sampled one) is handed over: a
   * checkpoint, no reply, the session free. */
  mbd_wreq q = greedy(50, 4);
  q.temperature = 0.5;
  assert_int_equal(mbd_wsched_generate(x.st, s, 8, &q, NULL), 0);
  mbd_wsched_tick(x.st);
  clear_out(&x);
  mbd_wsched_stop_generates(x.st, "stopping");
  bool error, ckpt;
  kinds(&x, &error, &ckpt);
  assert_true(ckpt && !error);
  assert_int_equal(x.st->ngen, 0);
  assert_false(s->busy);
  clear_out(&x);
  /* A greedy loop whose logits stayed on the device ends with its ERROR. */
  s = primed(&x);
  q.temperature = 0;
  assert_int_equal(mbd_wsched_generate(x.st, s, 9, &q, NULL), 0);
  mbd_wsched_tick(x.st);
  mbd_wsched_tick(x.st);
  clear_out(&x);
  mbd_wsched_stop_generates(x.st, "stopping");
  kinds(&x, &error, &ckpt);
  assert_true(error);
  clear_out(&x);
  mbd_wstate_destroy(&x.st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checkpoint_covers_reported_tokens),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_sigterm_hand_over),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
