/* The worker replies to one batched step while the next one computes
 * (worker/scheduler.h): what a client receives must not change. 40
 * GENERATE loops of different lengths, PARTIAL cadences, stop tokens and
 * sampling run at once through the real broker and worker, next to a
 * session driven by STEPs one at a time; one loop is cancelled half way and
 * its session closed, and another session gets a STEP and a CLOSE back to
 * back. Every stream must equal the same request run alone: the same
 * PARTIAL chunks in the same order, the same FINAL tokens and reason, the
 * same STEP logits (memcmp), and the same logits after each GENERATE (a
 * probe STEP). Loops end at different steps, so rows that need logits and
 * rows that do not share batches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define NS 40         /* generating sessions */
#define MAXTOK 96     /* longest loop */
#define NSTEP 12      /* STEPs of the stepping session */
#define PROBE_TOKEN 5 /* fed after each GENERATE: its logits show the session's state */
#define VICTIM 0      /* the loop that is cancelled */

static wh g_h;
static wh_fixture g_f;

/* What one GENERATE asks for. */
typedef struct gen_cfg {
  int prompt;            /* fixture row */
  int64_t max_tokens;
  int64_t partial_every;
  bool sampled;
  int64_t stop;          /* -1: none */
} gen_cfg;

/* What one GENERATE stream delivered. */
typedef struct stream {
  int64_t part[MAXTOK];  /* PARTIAL tokens in arrival order */
  int npart;             /* their count */
  int64_t chunk[MAXTOK]; /* each PARTIAL's length */
  int nchunk;
  int64_t final[MAXTOK];
  int nfinal;
  char reason[16];
  int code;              /* 0: FINAL; else the ERROR code */
  bool done;
} stream;

static gen_cfg cfg_of(int i) {
  gen_cfg c = {.prompt = i % (int)g_f.B,
               .max_tokens = i == VICTIM ? MAXTOK : 6 + (i * 7) % 41,
               .partial_every = 1 + i % 4,
               .sampled = i % 4 == 3,
               .stop = -1};
  if (i % 5 == 2) /* a token of the greedy continuation: the loop ends with "stop" */
    c.stop = g_f.greedy[(int64_t)c.prompt * (g_f.T + g_f.G) + g_f.T + (i % g_f.G)];
  return c;
}

static uint64_t send_gen(const char *sid, int i) {
  gen_cfg c = cfg_of(i);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3 + (c.sampled ? 3 : 0) + (c.stop >= 0 ? 1 : 0));
  mbd_pack_kv_str(&k.pk, "session", sid);
  mbd_pack_kv_i64(&k.pk, "max_tokens", c.max_tokens);
  mbd_pack_kv_i64(&k.pk, "partial_every", c.partial_every);
  if (c.sampled) {
    mbd_pack_kv_f64(&k.pk, "temperature", 0.8);
    mbd_pack_kv_i64(&k.pk, "top_k", 20);
    mbd_pack_kv_u64(&k.pk, "seed", 77 + (uint64_t)i);
  }
  if (c.stop >= 0) {
    mbd_pack_str(&k.pk, "stop");
    msgpack_pack_array(&k.pk, 1);
    msgpack_pack_int64(&k.pk, c.stop);
  }
  return wh_send(&g_h, MBD_CMD_GENERATE, &k.sb, 0, NULL, NULL);
}

/* Records reply m of a GENERATE stream; returns true when it ended it. */
static bool take(stream *s, const mbd_msg *m) {
  assert_false(s->done); /* nothing after the FINAL or ERROR */
  int64_t t[MAXTOK];
  if (mbd_msg_cmd(m) == MBD_CMD_PARTIAL) {
    int n = wh_tokens(m, t, MAXTOK);
    assert_true(n > 0 && s->npart + n <= MAXTOK);
    memcpy(s->part + s->npart, t, (size_t)n * sizeof *t);
    s->npart += n;
    s->chunk[s->nchunk++] = n;
    return false;
  }
  s->done = true;
  s->code = wh_code(m);
  if (s->code) return true;
  s->nfinal = wh_tokens(m, s->final, MAXTOK);
  assert_true(s->nfinal > 0);
  assert_int_equal(wh_str(m, "reason", s->reason, sizeof s->reason), 0);
  return true;
}

static void open_prefilled(char *sid, int prompt) {
  mbd_msg *m = wh_open(&g_h, sid, 64);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, g_f.ids + (int64_t)prompt * g_f.T, g_f.T, true),
              30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

/* The logits of STEP `token` on sid, into out[V]. */
static void step_logits(const char *sid, int64_t token, float *out) {
  mbd_msg *m = wh_wait(&g_h, wh_send_step(&g_h, sid, token), 30000);
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const void *p = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)g_f.V * 4);
  memcpy(out, p, len);
  mbd_msg_destroy(&m);
}

static void close_session(const char *sid) {
  mbd_msg *m = wh_wait(&g_h, wh_send_close(&g_h, sid), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

static void send_cancel(uint64_t tag) {
  mbd_msg *c = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_CANCEL, tag, &c, NULL), 0);
  assert_int_equal(mbd_msg_send(&c, g_h.sock, 0, NULL), 0);
}

static int64_t step_token(int k) { return (k * 13 + 1) % g_f.V; }

static void test_pipelined_replies_match_solo(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const size_t V = (size_t)g_f.V;
  wh_start_broker(&g_h);
  wh_start_worker(&g_h, "wA", "--capacity", "64", "--client-sessions", "64", "--max-batch", "64",
                  NULL);
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  static stream solo[NS], conc[NS];
  float *solo_probe = malloc(NS * V * 4), *solo_steps = malloc(NSTEP * V * 4);
  float *solo_closer = malloc(V * 4);
  assert_true(solo_probe && solo_steps && solo_closer);
  /* Alone: each request with nothing else on the worker. */
  for (int i = 0; i < NS; i++) {
    char sid[64];
    open_prefilled(sid, cfg_of(i).prompt);
    uint64_t tag = send_gen(sid, i);
    while (!solo[i].done) {
      mbd_msg *m = wh_recv(&g_h, 30000);
      assert_non_null(m);
      assert_true(mbd_msg_tag(m) == tag);
      take(&solo[i], m);
      mbd_msg_destroy(&m);
    }
    assert_int_equal(solo[i].code, 0);
    step_logits(sid, PROBE_TOKEN, solo_probe + (size_t)i * V);
    close_session(sid);
  }
  int nstop = 0;
  for (int i = 0; i < NS; i++) nstop += !strcmp(solo[i].reason, "stop");
  assert_true(nstop > 0); /* both end reasons are covered */
  char stepper[64], closer[64];
  open_prefilled(stepper, 1 % (int)g_f.B);
  for (int k = 0; k < NSTEP; k++) step_logits(stepper, step_token(k), solo_steps + (size_t)k * V);
  close_session(stepper);
  open_prefilled(closer, 0);
  step_logits(closer, PROBE_TOKEN, solo_closer);
  close_session(closer);

  /* Together. */
  char sids[NS][64];
  for (int i = 0; i < NS; i++) open_prefilled(sids[i], cfg_of(i).prompt);
  open_prefilled(stepper, 1 % (int)g_f.B);
  open_prefilled(closer, 0);
  uint64_t tags[NS];
  for (int i = 0; i < NS; i++) tags[i] = send_gen(sids[i], i);
  uint64_t step_tag = wh_send_step(&g_h, stepper, step_token(0));
  int nsteps = 0, ndone = 0;
  uint64_t cancel_close = 0, closer_step = 0, closer_close = 0;
  bool cancelled = false, victim_closed = false, closer_stepped = false, closer_closed = false;
  double end = wh_now() + 120;
  while ((ndone < NS || nsteps < NSTEP || !victim_closed || !closer_stepped || !closer_closed) &&
         wh_now() < end) {
    mbd_msg *m = wh_recv(&g_h, 200);
    if (!m) continue;
    uint64_t tag = mbd_msg_tag(m);
    int i = -1;
    for (int k = 0; k < NS; k++)
      if (tags[k] == tag) i = k;
    if (i >= 0) {
      ndone += take(&conc[i], m);
      if (i == VICTIM && !cancelled && conc[i].nchunk == 2) { /* half way: stop it */
        send_cancel(tags[i]);
        cancelled = true;
      }
      if (i == VICTIM && conc[i].done) cancel_close = wh_send_close(&g_h, sids[VICTIM]);
      if (i == 1 && conc[i].nchunk == 1) { /* a STEP and a CLOSE back to back */
        closer_step = wh_send_step(&g_h, closer, PROBE_TOKEN);
        closer_close = wh_send_close(&g_h, closer);
      }
    } else if (tag == step_tag) {
      assert_int_equal(wh_code(m), 0);
      size_t len = 0;
      const void *p = wh_tensor(m, &len);
      assert_int_equal(len, V * 4);
      assert_memory_equal(p, solo_steps + (size_t)nsteps * V, V * 4);
      if (++nsteps < NSTEP) step_tag = wh_send_step(&g_h, stepper, step_token(nsteps));
    } else if (tag == cancel_close) { /* BUSY until the worker has stopped the loop */
      int code = wh_code(m);
      if (code == MBD_E_BUSY) cancel_close = wh_send_close(&g_h, sids[VICTIM]);
      else assert_int_equal(code, 0);
      victim_closed = code == 0;
    } else if (tag == closer_step) {
      assert_int_equal(wh_code(m), 0);
      size_t len = 0;
      const void *p = wh_tensor(m, &len);
      assert_int_equal(len, V * 4);
      assert_memory_equal(p, solo_closer, V * 4);
      closer_stepped = true;
    } else if (tag == closer_close) { /* BUSY while the STEP was queued, then done */
      int code = wh_code(m);
      if (code == MBD_E_BUSY) closer_close = wh_send_close(&g_h, closer);
      else assert_int_equal(code, 0);
      closer_closed = code == 0;
    } else {
      fail_msg("reply to unknown tag %llu", (unsigned long long)tag);
    }
    mbd_msg_destroy(&m);
  }
  assert_int_equal(ndone, NS);
  assert_int_equal(nsteps, NSTEP);
  assert_true(victim_closed && closer_stepped && closer_closed);

  for (int i = 0; i < NS; i++) {
    const stream *a = &solo[i], *c = &conc[i];
    if (i == VICTIM && c->code) { /* stopped: what it streamed is the solo run's start */
      assert_int_equal(c->code, MBD_E_CANCELLED);
      assert_true(c->npart < a->nfinal);
      assert_memory_equal(c->part, a->final, (size_t)c->npart * 8);
      continue;
    }
    assert_int_equal(c->code, 0);
    assert_string_equal(c->reason, a->reason);
    assert_int_equal(c->nfinal, a->nfinal);
    assert_memory_equal(c->final, a->final, (size_t)a->nfinal * 8);
    assert_int_equal(c->nchunk, a->nchunk); /* the same PARTIAL cadence */
    assert_memory_equal(c->chunk, a->chunk, (size_t)a->nchunk * 8);
    assert_int_equal(c->npart, a->npart);
    assert_memory_equal(c->part, a->part, (size_t)a->npart * 8);
  }
  /* The logits each loop left behind, probed all at once (one batch). */
  uint64_t ptags[NS];
  for (int i = 0; i < NS; i++)
    ptags[i] = i == VICTIM ? 0 : wh_send_step(&g_h, sids[i], PROBE_TOKEN);
  for (int i = 0; i < NS; i++) {
    if (i == VICTIM) continue;
    mbd_msg *m = wh_wait(&g_h, ptags[i], 30000);
    assert_int_equal(wh_code(m), 0);
    size_t len = 0;
    const void *p = wh_tensor(m, &len);
    assert_int_equal(len, V * 4);
    assert_memory_equal(p, solo_probe + (size_t)i * V, V * 4);
    mbd_msg_destroy(&m);
  }
  free(solo_probe);
  free(solo_steps);
  free(solo_closer);
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_pipelined_replies_match_solo)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
