/* Mamba-3 through the real processes: one CPU worker serves a Mamba-3 model
 * ("tiny", the state-spaces/mamba fixture) and a Mamba-1 model ("m1") at
 * once; sessions of both run interleaved, each bit-identical to the
 * in-process model run alone; a Mamba-3 session exported from worker A and
 * imported on worker B continues bit-exactly (prefill of the rest, then
 * greedy generation equal to the fixture's greedy tokens). */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "kernels/model/mamba1.h"
#include "kernels/model/mamba3.h"
#include "support/wh_requests.h"
#include "support/wh_sessions.h"
#include "support/worker_harness.h"

static wh g_h;

static mbd_msg *open_on(const char *model, char *sid, size_t cap) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "model", model);
  mbd_msg *m = wh_call(&g_h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
  if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) wh_str(m, "session", sid, cap);
  return m;
}

/* The logits tensor of a FINAL into a new buffer of n floats. */
static float *take_logits(mbd_msg *m, size_t n) {
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const void *p = wh_tensor(m, &len);
  assert_int_equal(len, n * 4);
  float *v = malloc(n * 4);
  memcpy(v, p, n * 4);
  mbd_msg_destroy(&m);
  return v;
}

static void ids32(const int64_t *ids, int64_t n, int32_t *out) {
  for (int64_t i = 0; i < n; i++) out[i] = (int32_t)ids[i];
}

static void test_mamba3_service(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char m1dir[600], exp[700];
  snprintf(g_h.model_dir, sizeof g_h.model_dir, "%s/mamba3/tiny-d64-s16-c16", fx);
  snprintf(m1dir, sizeof m1dir, "m1=%s/mamba1/tiny-d64", fx);
  snprintf(exp, sizeof exp, "%s/expected.safetensors", g_h.model_dir);
  if (access(exp, R_OK)) {
    print_message("no fixture %s: skipped\n", exp);
    wh_fini(&g_h);
    exit(77);
  }
  mbd_error err = {0};
  mbd_safetensors *st = NULL;
  assert_int_equal(mbd_safetensors_open(exp, &st, &err), 0);
  const mbd_st_entry *ide = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *gre = mbd_safetensors_find(st, "greedy");
  const int64_t T = ide->desc.shape[1], G = gre->desc.shape[1] - T, H = T / 2;
  int64_t *ids = malloc(ide->nbytes), *greedy = malloc(gre->nbytes);
  memcpy(ids, ide->data, ide->nbytes);
  memcpy(greedy, gre->data, gre->nbytes);
  mbd_safetensors_destroy(&st);

  /* In-process references, each run alone. */
  mbd_mamba3_options o3;
  mbd_mamba3_options_default(&o3);
  o3.threads = 2;
  mbd_mamba3_model *m3 = NULL;
  assert_int_equal(mbd_mamba3_load(g_h.model_dir, &o3, &m3, &err), 0);
  const int64_t V = mbd_mamba3_vocab(m3);
  const int64_t *prompt = ids + 1 * T;
  int32_t p32[256];
  ids32(prompt, T, p32);
  float *ref3 = malloc((size_t)(T * V) * 4);
  mbd_mamba3_state *s3 = NULL;
  assert_int_equal(mbd_mamba3_state_new(m3, &s3, &err), 0);
  const int32_t *tp = p32;
  int64_t tl = T;
  assert_int_equal(mbd_mamba3_prefill(m3, &s3, 1, &tp, &tl, MBD_LOGITS_ALL, ref3, &err), 0);
  mbd_mamba3_state_destroy(&s3);
  mbd_mamba3_destroy(&m3);
  mbd_mamba1_options o1;
  mbd_mamba1_options_default(&o1);
  o1.threads = 2;
  mbd_mamba1_model *m1 = NULL;
  assert_int_equal(mbd_mamba1_load(m1dir + 3, &o1, &m1, &err), 0);
  const int64_t V1 = mbd_mamba1_vocab(m1);
  float *ref1 = malloc((size_t)(T * V1) * 4);
  mbd_mamba1_state *s1 = NULL;
  assert_int_equal(mbd_mamba1_state_new(m1, &s1, &err), 0);
  assert_int_equal(
      mbd_mamba1_prefill(m1, &s1, 1, &tp, &tl, MBD_MAMBA1_LOGITS_ALL, ref1, &err), 0);
  mbd_mamba1_state_destroy(&s1);
  mbd_mamba1_destroy(&m1);

  wh_start_broker(&g_h);
  pid_t a = wh_start_worker(&g_h, "wA", "--model", m1dir, NULL);
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  /* A Mamba-3 and a Mamba-1 session on A, interleaved. */
  char sid[64] = "", sid1[64] = "";
  mbd_msg *m = open_on("tiny", sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = open_on("m1", sid1, sizeof sid1);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  uint64_t t3 = wh_send_prefill(&g_h, sid, prompt, H, false);
  uint64_t t1 = wh_send_prefill(&g_h, sid1, prompt, H, false);
  float *got3 = take_logits(wh_wait(&g_h, t3, 30000), (size_t)(H * V));
  float *got1 = take_logits(wh_wait(&g_h, t1, 30000), (size_t)(H * V1));
  assert_memory_equal(got3, ref3, (size_t)(H * V) * 4);
  assert_memory_equal(got1, ref1, (size_t)(H * V1) * 4);
  free(got3);
  free(got1);
  t1 = wh_send_prefill(&g_h, sid1, prompt + H, T - H, false);
  got1 = take_logits(wh_wait(&g_h, t1, 30000), (size_t)((T - H) * V1));
  assert_memory_equal(got1, ref1 + H * V1, (size_t)((T - H) * V1) * 4);
  free(got1);

  /* Export the Mamba-3 session from A; B joins, A leaves; import on B. */
  size_t n = 0;
  uint8_t *blob = wh_export(&g_h, sid, 60000, &n);
  assert_true(n > 256 && n % 8 == 0);
  wh_start_worker(&g_h, "wB", "--model", m1dir, NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  assert_int_equal(wh_stop(a, SIGTERM), 0);
  g_h.procs[0] = 0;
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.dtype, sizeof want.dtype, "f32");
  m = wh_wait(&g_h, wh_send_import(&g_h, blob, n, &want), 60000);
  assert_int_equal(wh_code(m), 0);
  char sid_b[64] = "", wname[32] = "";
  wh_str(m, "session", sid_b, sizeof sid_b);
  wh_str(m, "worker", wname, sizeof wname);
  assert_string_equal(wname, "wB");
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid_b, prompt + H, T - H, false), 30000);
  got3 = take_logits(m, (size_t)((T - H) * V));
  assert_memory_equal(got3, ref3 + H * V, (size_t)((T - H) * V) * 4);
  free(got3);
  m = wh_wait(&g_h, wh_send_generate(&g_h, sid_b, G, 0, 0), 60000);
  assert_int_equal(wh_code(m), 0);
  int64_t toks[64];
  assert_int_equal(wh_tokens(m, toks, 64), G);
  assert_memory_equal(toks, greedy + 1 * (T + G) + T, (size_t)G * 8);
  mbd_msg_destroy(&m);
  free(blob);
  free(ref3);
  free(ref1);
  free(ids);
  free(greedy);
  wh_fini(&g_h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mamba3_service)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
