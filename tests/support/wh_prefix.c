/* The prefix state cache through the client library (see wh_prefix.h). */
#include "support/wh_prefix.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/events.h"

void wh_prefix_request(mbd_client *c, const char *model, const int64_t *ids, int64_t n,
                       int64_t point, int64_t vocab, int64_t gen, int label, float *logits,
                       int64_t *toks) {
  const int64_t points[1] = {point};
  mbd_error err = {0};
  mbd_session *s = NULL;
  if (mbd_session_open_prompt(c, NULL, model, ids, n, 0, points, 1, &s, &err))
    fail_msg("open %d: %s", label, err.msg);
  mbd_tensor_in in = {.data = ids};
  int64_t sh[1] = {n};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 1, sh, NULL);
  mbd_tensor_out out;
  if (mbd_session_prefill_cached(s, NULL, &in, true, points, 1, &out, &err))
    fail_msg("prefill %d: %s", label, err.msg);
  assert_int_equal(out.nbytes, (size_t)vocab * 4);
  memcpy(logits, out.data, out.nbytes);
  mbd_tensor_out_release(&out);
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = gen;
  int64_t *t = NULL;
  size_t nt = 0;
  char reason[16];
  if (mbd_session_generate(s, NULL, &gp, NULL, NULL, &t, &nt, reason, &err))
    fail_msg("generate %d: %s", label, err.msg);
  assert_int_equal(nt, gen);
  memcpy(toks, t, (size_t)gen * sizeof *t);
  free(t);
  if (mbd_session_close(&s, &err)) fail_msg("close %d: %s", label, err.msg);
}

bool wh_prefix_stats(mbd_client *c, const char *name, mbd_prefix_cache_info *x) {
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  if (mbd_client_status(c, &r, &err)) fail_msg("status: %s", err.msg);
  bool found = false;
  memset(x, 0, sizeof *x);
  for (size_t i = 0; i < r->n_workers; i++)
    if (!strcmp(r->workers[i].name, name) && r->workers[i].has_prefix_cache) {
      found = true;
      *x = r->workers[i].prefix_cache;
    }
  mbd_status_report_free(&r);
  return found;
}

void wh_wait_listed(mbd_client *c, size_t n, int timeout_ms) {
  for (int k = 0; k < timeout_ms / 100; k++) {
    mbd_status_report *r = NULL;
    mbd_error err = {0};
    if (mbd_client_status(c, &r, &err)) fail_msg("status: %s", err.msg);
    size_t have = r->n_workers;
    mbd_status_report_free(&r);
    if (have == n) return;
    ev_nap_ms(100);
  }
  fail_msg("the broker never listed %zu workers", n);
}
