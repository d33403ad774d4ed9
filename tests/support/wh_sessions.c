/* Many sessions at once through the worker harness (see wh_sessions.h). */
#include "support/wh_sessions.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "support/wh_requests.h"

void wh_open_prefill(wh *h, char (*sids)[64], int n, wh_prompt_fn prompt, int timeout_ms) {
  uint64_t t0 = 0;
  for (int i = 0; i < n; i++) {
    uint64_t t = wh_send_open(h);
    if (!i) t0 = t;
  }
  mbd_msg **m = calloc((size_t)n, sizeof *m);
  assert_non_null(m);
  assert_int_equal(wh_collect(h, t0, (size_t)n, m, timeout_ms), 0);
  for (int i = 0; i < n; i++) {
    assert_int_equal(wh_code(m[i]), 0);
    assert_int_equal(wh_str(m[i], "session", sids[i], 64), 0);
  }
  wh_free_all(m, (size_t)n);
  for (int i = 0; i < n; i++) {
    int64_t len = 0;
    const int64_t *ids = prompt(i, &len);
    uint64_t t = wh_send_prefill(h, sids[i], ids, len, true);
    if (!i) t0 = t;
  }
  assert_int_equal(wh_collect(h, t0, (size_t)n, m, timeout_ms), 0);
  for (int i = 0; i < n; i++) assert_int_equal(wh_code(m[i]), 0);
  wh_free_all(m, (size_t)n);
  free(m);
}

void wh_generate_all(wh *h, char (*sids)[64], int n, int64_t max_tokens, pid_t victim, int sig,
                     int timeout_ms, int64_t *out) {
  uint64_t t0 = 0;
  for (int i = 0; i < n; i++) {
    uint64_t t = wh_send_generate(h, sids[i], max_tokens, i % 2 ? 0.9 : 0.0, 1000 + (uint64_t)i);
    if (!i) t0 = t;
  }
  const int64_t all = n * max_tokens;
  int64_t *streamed = calloc((size_t)all, sizeof *streamed);
  int64_t *tok = calloc((size_t)max_tokens, sizeof *tok);
  int64_t *nstream = calloc((size_t)n, sizeof *nstream);
  bool *finished = calloc((size_t)n, sizeof *finished);
  assert_true(streamed && tok && nstream && finished);
  int done = 0;
  int64_t total = 0;
  double t_start = wh_now(), end = t_start + timeout_ms / 1000.0;
  while (done < n && wh_now() < end) {
    if (victim && total >= all / 4) {
      kill(victim, sig);
      fprintf(stderr, "signal %d to the worker after %lld of %lld streamed tokens (%.3f s in)\n",
              sig, (long long)total, (long long)all, wh_now() - t_start);
      victim = 0;
    }
    mbd_msg *m = wh_recv(h, 200);
    if (!m) continue;
    int i = (int)(mbd_msg_tag(m) - t0);
    assert_true(i >= 0 && i < n && !finished[i]);
    size_t at = (size_t)i * (size_t)max_tokens;
    int64_t *got = streamed + at, *fin = out + at;
    if (mbd_msg_cmd(m) == MBD_CMD_PARTIAL) {
      int k = wh_tokens(m, tok, (size_t)max_tokens);
      assert_true(k >= 0 && nstream[i] + k <= max_tokens);
      memcpy(got + nstream[i], tok, (size_t)k * sizeof *tok);
      nstream[i] += k;
      total += k;
    } else {
      assert_int_equal(wh_code(m), 0);
      assert_int_equal(wh_tokens(m, fin, (size_t)max_tokens), max_tokens);
      /* The client saw its stream continue: no token lost, none repeated (the
       * last one may come in the FINAL only). */
      assert_true(nstream[i] >= max_tokens - 1);
      assert_memory_equal(got, fin, (size_t)nstream[i] * sizeof *fin);
      finished[i] = true;
      done++;
    }
    mbd_msg_destroy(&m);
  }
  fprintf(stderr, "%d GENERATEs of %lld tokens done in %.3f s\n", done, (long long)max_tokens,
          wh_now() - t_start);
  free(finished);
  free(nstream);
  free(tok);
  free(streamed);
  assert_int_equal(done, n);
  assert_int_equal(victim, 0); /* the signal went out mid-stream */
}

uint8_t *wh_export(wh *h, const char *sid, int timeout_ms, size_t *n) {
  mbd_msg *m = wh_wait(h, wh_send_export(h, sid), timeout_ms);
  assert_int_equal(wh_code(m), 0);
  const void *p = wh_tensor(m, n);
  assert_true(p && *n > 0);
  uint8_t *b = malloc(*n);
  assert_non_null(b);
  memcpy(b, p, *n);
  mbd_msg_destroy(&m);
  return b;
}

void wh_close(wh *h, const char *sid) {
  mbd_msg *m = wh_wait(h, wh_send_close(h, sid), 60000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

mbd_msg *wh_status(wh *h) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 0);
  mbd_msg *m = wh_call(h, MBD_CMD_STATUS, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  return m;
}

uint64_t wh_counter(wh *h, const char *name) {
  mbd_msg *m = wh_status(h);
  mbd_body *b = wh_body(m);
  assert_non_null(b);
  uint64_t v = 0;
  const msgpack_object *c = mbd_obj_get(mbd_body_root(b), "counters");
  assert_non_null(c);
  assert_int_equal(mbd_obj_u64(c, name, true, &v, NULL), 0);
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  return v;
}

int64_t wh_worker_inflight(wh *h, int i) {
  mbd_msg *m = wh_status(h);
  mbd_body *b = wh_body(m);
  assert_non_null(b);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
  int64_t v = -1;
  if (ws && ws->type == MSGPACK_OBJECT_ARRAY && ws->via.array.size > (uint32_t)i)
    assert_int_equal(mbd_obj_i64(&ws->via.array.ptr[i], "inflight", true, &v, NULL), 0);
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  return v;
}

void wh_assert_one_route(wh *h, int n, const char *backend) {
  mbd_msg *m = wh_status(h);
  mbd_body *b = wh_body(m);
  assert_non_null(b);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
  assert_non_null(ws);
  assert_int_equal(ws->type, MSGPACK_OBJECT_ARRAY);
  assert_int_equal(ws->via.array.size, n);
  char id0[80] = "";
  for (int i = 0; i < n; i++) {
    char id[80], be[16];
    assert_int_equal(mbd_obj_str(&ws->via.array.ptr[i], "route_id", true, id, sizeof id, NULL), 0);
    assert_int_equal(mbd_obj_str(&ws->via.array.ptr[i], "backend", true, be, sizeof be, NULL), 0);
    assert_string_equal(be, backend);
    fprintf(stderr, "worker %d: route id %.16s...\n", i, id);
    if (!i) snprintf(id0, sizeof id0, "%s", id);
    assert_string_equal(id, id0);
  }
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
}
