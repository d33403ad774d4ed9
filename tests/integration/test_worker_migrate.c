/* Session migration through the real processes: EXPORT on worker A, SIGTERM A
 * (clean exit 0), IMPORT on worker B of the same route, and the continuation
 * (prefill of the rest of the prompt, then greedy generation) equals the
 * in-process model bit for bit and the fixture's greedy tokens. IMPORT on a
 * worker of another route (bf16) and IMPORT of a blob with altered model
 * identity are refused with STATE. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>

#include <cmocka.h>

#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

static wh g_h;
static wh_fixture g_f;

static mbd_msg *do_import(const void *blob, size_t n, const char *dtype) {
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.dtype, sizeof want.dtype, "%s", dtype);
  return wh_wait(&g_h, wh_send_import(&g_h, blob, n, &want), 60000);
}

static void test_export_import(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const int64_t T = g_f.T, V = g_f.V, G = g_f.G, H = T / 2;
  wh_start_broker(&g_h);
  pid_t a = wh_start_worker(&g_h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  /* On A: open, prefill the first half of prompt 1, export. */
  const int64_t *prompt = g_f.ids + 1 * T;
  char sid[64] = "";
  mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, prompt, H, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 1);
  mbd_pack_kv_str(&k.pk, "session", sid);
  m = wh_call(&g_h, MBD_CMD_EXPORT, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  char rid_a[80] = "";
  wh_str(m, "route_id", rid_a, sizeof rid_a);
  size_t n = 0;
  const void *p = wh_tensor(m, &n);
  assert_true(n > 256 && n % 8 == 0);
  uint8_t *blob = malloc(n);
  memcpy(blob, p, n);
  mbd_msg_destroy(&m);

  /* B joins, A leaves cleanly (SIGTERM -> exit 0). */
  wh_start_worker(&g_h, "wB", NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  assert_int_equal(wh_stop(a, SIGTERM), 0);
  g_h.procs[0] = 0;
  /* The old session died with A. */
  m = wh_wait(&g_h, wh_send_step(&g_h, sid, 1), 30000);
  assert_int_not_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);

  /* Import on B and continue. */
  m = do_import(blob, n, "f32");
  assert_int_equal(wh_code(m), 0);
  char sid_b[64] = "", wname[32] = "", rid_b[80] = "";
  wh_str(m, "session", sid_b, sizeof sid_b);
  wh_str(m, "worker", wname, sizeof wname);
  wh_str(m, "route_id", rid_b, sizeof rid_b);
  assert_string_equal(wname, "wB");
  assert_string_equal(rid_a, rid_b); /* same route */
  assert_string_not_equal(sid, sid_b);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid_b, prompt + H, T - H, false), 30000);
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const float *got = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)((T - H) * V) * 4);
  float *ref = malloc((size_t)(T * V) * 4);
  mbd_mamba1_state *s = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
  wh_ref_prefill(&g_f, s, prompt, T, ref); /* the whole prompt, uninterrupted */
  assert_memory_equal(got, ref + H * V, (size_t)((T - H) * V) * 4);
  mbd_msg_destroy(&m);
  mbd_mamba1_state_destroy(&s);
  free(ref);
  m = wh_wait(&g_h, wh_send_generate(&g_h, sid_b, G, 0, 0), 60000);
  assert_int_equal(wh_code(m), 0);
  int64_t toks[64];
  assert_int_equal(wh_tokens(m, toks, 64), G);
  assert_memory_equal(toks, g_f.greedy + 1 * (T + G) + T, (size_t)G * 8);
  mbd_msg_destroy(&m);

  /* Altered model identity: refused. */
  uint8_t *bad = malloc(n);
  memcpy(bad, blob, n);
  bad[96] = bad[96] == 'a' ? 'b' : 'a'; /* first hex digit of the model digest */
  m = do_import(bad, n, "f32");
  assert_int_equal(wh_code(m), MBD_E_STATE);
  mbd_msg_destroy(&m);
  /* Truncated blob: FORMAT. */
  m = do_import(blob, n - 8, "f32");
  assert_int_equal(wh_code(m), MBD_E_FORMAT);
  mbd_msg_destroy(&m);
  free(bad);

  /* A bf16 worker (another route) refuses the f32 state. */
  wh_start_worker(&g_h, "wC", "--dtype", "bf16", NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  m = do_import(blob, n, "bf16");
  assert_int_equal(wh_code(m), MBD_E_STATE);
  mbd_msg_destroy(&m);
  free(blob);
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_export_import)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
