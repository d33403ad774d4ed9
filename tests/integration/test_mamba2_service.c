/* Mamba-1 and Mamba-2 models served by one CPU worker (real broker and worker
 * processes): sessions of both, and two sessions of the Mamba-2 model, with
 * their requests in flight together, each give the bits of the in-process
 * solo run; a Mamba-2 session exported from one worker and imported on
 * another continues bit-exactly, greedy generation included; mambad-run
 * serves the family too. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "common/safetensors.h"
#include "kernels/model/mamba2.h"
#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/wh_sessions.h"
#include "support/worker_harness.h"

#define M2_CASE "small-d256-g2-s32-c16"

static wh g_h;
static wh_fixture g_f; /* the Mamba-1 model "tiny" */

typedef struct m2_fixture {
  char dir[1024];
  mbd_safetensors *st;
  const int64_t *ids; /* [B,T] */
  int64_t B, T, V;
  mbd_mamba2_model *model; /* in-process reference, f32 */
} m2_fixture;

static m2_fixture g_m2;
static char g_m2arg[1100]; /* "m2=DIR" */

static int m2_load(m2_fixture *f) {
  memset(f, 0, sizeof *f);
  const char *root = getenv("MBD_FIXTURES_DIR");
  if (!root) return -1;
  snprintf(f->dir, sizeof f->dir, "%s/mamba2/" M2_CASE, root);
  char p[1100];
  snprintf(p, sizeof p, "%s/expected.safetensors", f->dir);
  mbd_error e = {0};
  if (mbd_safetensors_open(p, &f->st, &e)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(f->st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(f->st, "logits");
  if (!ids || !lg) return -1;
  f->ids = ids->data;
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->V = lg->desc.shape[2];
  mbd_mamba2_options o;
  mbd_mamba2_options_default(&o);
  o.threads = 1;
  return mbd_mamba2_load(f->dir, &o, &f->model, &e) ? -1 : 0;
}

static void m2_free(m2_fixture *f) {
  mbd_mamba2_destroy(&f->model);
  mbd_safetensors_destroy(&f->st);
}

/* In-process Mamba-2 reference: feeds ids[T] to s, logits [T, V]. */
static void m2_ref(mbd_mamba2_state *s, const int64_t *ids, int64_t T, float *logits) {
  int32_t *t32 = malloc((size_t)T * sizeof *t32);
  for (int64_t i = 0; i < T; i++) t32[i] = (int32_t)ids[i];
  const int32_t *p = t32;
  mbd_error e = {0};
  if (mbd_mamba2_prefill(g_m2.model, &s, 1, &p, &T, MBD_LOGITS_ALL, logits, &e))
    fail_msg("reference prefill: %s", e.msg);
  free(t32);
}

static mbd_msg *open_model(const char *model, char *sid, size_t cap) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "model", model);
  mbd_msg *m = wh_call(&g_h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
  if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) wh_str(m, "session", sid, cap);
  return m;
}

/* The FINAL/ERROR replies of n tags sent together, by tag order. */
static void collect(const uint64_t *tags, int n, mbd_msg **out) {
  for (int i = 0; i < n; i++) out[i] = NULL;
  int got = 0;
  while (got < n) {
    mbd_msg *m = wh_recv(&g_h, 60000);
    if (!m) fail_msg("no reply after 60 s (%d of %d)", got, n);
    if (mbd_msg_cmd(m) == MBD_CMD_PARTIAL) {
      mbd_msg_destroy(&m);
      continue;
    }
    int k = -1;
    for (int i = 0; i < n; i++)
      if (tags[i] == mbd_msg_tag(m)) k = i;
    if (k < 0 || out[k]) fail_msg("unexpected reply tag %llu", (unsigned long long)mbd_msg_tag(m));
    out[k] = m;
    got++;
  }
}

static void expect_tensor(mbd_msg *m, const float *ref, size_t nfloat, const char *what) {
  if (wh_code(m) != 0) fail_msg("%s failed", what);
  size_t len = 0;
  const void *got = wh_tensor(m, &len);
  if (len != nfloat * 4) fail_msg("%s: %zu bytes, want %zu", what, len, nfloat * 4);
  if (memcmp(got, ref, len)) fail_msg("%s: bits differ from the solo run", what);
}

/* Sessions of tiny (Mamba-1) and of m2 (two sessions) in flight together. */
static void test_mixed_sessions(void **state) {
  (void)state;
  const int64_t T1 = g_f.T, V1 = g_f.V, T2 = g_m2.T, V2 = g_m2.V;
  char s1[64] = "", s2a[64] = "", s2b[64] = "";
  mbd_msg *m = open_model("tiny", s1, sizeof s1);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = open_model("m2", s2a, sizeof s2a);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = open_model("m2", s2b, sizeof s2b);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  const int64_t *p1 = g_f.ids, *p2a = g_m2.ids, *p2b = g_m2.ids + T2;
  /* references: the same tokens, then 4 steps of fixed tokens */
  const int64_t steps[4] = {3, 1, 4, 1};
  float *r1 = malloc((size_t)(T1 + 4) * V1 * 4), *r2a = malloc((size_t)(T2 + 4) * V2 * 4),
        *r2b = malloc((size_t)(T2 + 4) * V2 * 4);
  mbd_mamba1_state *rs1 = NULL;
  mbd_mamba2_state *rs2a = NULL, *rs2b = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &rs1, NULL), 0);
  assert_int_equal(mbd_mamba2_state_new(g_m2.model, &rs2a, NULL), 0);
  assert_int_equal(mbd_mamba2_state_new(g_m2.model, &rs2b, NULL), 0);
  wh_ref_prefill(&g_f, rs1, p1, T1, r1);
  m2_ref(rs2a, p2a, T2, r2a);
  m2_ref(rs2b, p2b, T2, r2b);
  for (int k = 0; k < 4; k++) {
    wh_ref_prefill(&g_f, rs1, steps + k, 1, r1 + (T1 + k) * V1);
    m2_ref(rs2a, steps + k, 1, r2a + (T2 + k) * V2);
    m2_ref(rs2b, steps + k, 1, r2b + (T2 + k) * V2);
  }
  uint64_t tags[3];
  mbd_msg *rep[3];
  tags[0] = wh_send_prefill(&g_h, s1, p1, T1, false);
  tags[1] = wh_send_prefill(&g_h, s2a, p2a, T2, false);
  tags[2] = wh_send_prefill(&g_h, s2b, p2b, T2, false);
  collect(tags, 3, rep);
  expect_tensor(rep[0], r1, (size_t)(T1 * V1), "mamba1 prefill");
  expect_tensor(rep[1], r2a, (size_t)(T2 * V2), "mamba2 prefill a");
  expect_tensor(rep[2], r2b, (size_t)(T2 * V2), "mamba2 prefill b");
  for (int i = 0; i < 3; i++) mbd_msg_destroy(&rep[i]);
  for (int k = 0; k < 4; k++) {
    tags[0] = wh_send_step(&g_h, s1, steps[k]);
    tags[1] = wh_send_step(&g_h, s2a, steps[k]);
    tags[2] = wh_send_step(&g_h, s2b, steps[k]);
    collect(tags, 3, rep);
    expect_tensor(rep[0], r1 + (T1 + k) * V1, (size_t)V1, "mamba1 step");
    expect_tensor(rep[1], r2a + (T2 + k) * V2, (size_t)V2, "mamba2 step a");
    expect_tensor(rep[2], r2b + (T2 + k) * V2, (size_t)V2, "mamba2 step b");
    for (int i = 0; i < 3; i++) mbd_msg_destroy(&rep[i]);
  }
  mbd_mamba1_state_destroy(&rs1);
  mbd_mamba2_state_destroy(&rs2a);
  mbd_mamba2_state_destroy(&rs2b);
  free(r1);
  free(r2a);
  free(r2b);
}

static mbd_msg *import_m2(const void *blob, size_t n) {
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.dtype, sizeof want.dtype, "f32");
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "m2");
  mbd_pack_str(&k.pk, "route");
  mbd_pack_route_want(&k.pk, &want);
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  int64_t s[1] = {(int64_t)(n / 8)};
  wh_ref(&k.pk, "state", "i64", 1, s, 0);
  const void *pl[1] = {blob};
  size_t lens[1] = {n};
  return wh_wait(&g_h, wh_send(&g_h, MBD_CMD_IMPORT, &k.sb, 1, pl, lens), 60000);
}

/* Export a Mamba-2 session on wA, import on wB, continue: the uninterrupted
 * bits; then greedy generation equals the in-process greedy. */
static void test_export_import(void **state) {
  (void)state;
  enum { G = 8 };
  const int64_t T = g_m2.T, V = g_m2.V, H = T / 2 + 1;
  const int64_t *prompt = g_m2.ids + T; /* prompt 1 */
  char sid[64] = "";
  mbd_msg *m = open_model("m2", sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, prompt, H, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  size_t n = 0;
  uint8_t *blob = wh_export(&g_h, sid, 60000, &n);
  assert_true(n > 256 && n % 8 == 0);
  /* a second worker serving both joins, the first leaves cleanly */
  wh_start_worker(&g_h, "wB", "--model", g_m2arg, NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  assert_int_equal(wh_stop(g_h.procs[0], SIGTERM), 0);
  g_h.procs[0] = 0;
  m = import_m2(blob, n);
  assert_int_equal(wh_code(m), 0);
  char sid_b[64] = "", wname[32] = "";
  wh_str(m, "session", sid_b, sizeof sid_b);
  wh_str(m, "worker", wname, sizeof wname);
  assert_string_equal(wname, "wB");
  mbd_msg_destroy(&m);
  /* reference: the whole prompt uninterrupted, then greedy */
  float *ref = malloc((size_t)(T * V) * 4), *row = malloc((size_t)V * 4);
  mbd_mamba2_state *rs = NULL;
  assert_int_equal(mbd_mamba2_state_new(g_m2.model, &rs, NULL), 0);
  m2_ref(rs, prompt, T, ref);
  int64_t want[G];
  const float *last = ref + (T - 1) * V;
  for (int64_t g = 0; g < G; g++) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (last[v] > last[best]) best = v;
    want[g] = best;
    m2_ref(rs, &want[g], 1, row);
    last = row;
  }
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid_b, prompt + H, T - H, false), 30000);
  expect_tensor(m, ref + H * V, (size_t)((T - H) * V), "continued prefill on wB");
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_generate(&g_h, sid_b, G, 0, 0), 60000);
  assert_int_equal(wh_code(m), 0);
  int64_t toks[64];
  assert_int_equal(wh_tokens(m, toks, 64), G);
  assert_memory_equal(toks, want, (size_t)G * 8);
  mbd_msg_destroy(&m);
  /* a Mamba-2 image under the Mamba-1 model is refused */
  mbd_route_want rw;
  memset(&rw, 0, sizeof rw);
  snprintf(rw.dtype, sizeof rw.dtype, "f32");
  m = wh_wait(&g_h, wh_send_import(&g_h, blob, n, &rw), 60000);
  assert_int_not_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  mbd_mamba2_state_destroy(&rs);
  free(ref);
  free(row);
  free(blob);
}

/* mambad-run on the tiny Mamba-2 fixture: its greedy continuation; and a
 * synthetic Mamba-2 checkpoint from mambad-model runs. */
static void test_cli(void **state) {
  (void)state;
  const char *root = getenv("MBD_FIXTURES_DIR");
  char tiny[1100], out[600];
  snprintf(tiny, sizeof tiny, "%s/mamba2/tiny-d64-s16-c8", root);
  snprintf(out, sizeof out, "%s/run.safetensors", g_h.dir);
  mbd_safetensors *exp = NULL, *got = NULL;
  char p[1200];
  snprintf(p, sizeof p, "%s/expected.safetensors", tiny);
  mbd_error e = {0};
  assert_int_equal(mbd_safetensors_open(p, &exp, &e), 0);
  const mbd_st_entry *gr = mbd_safetensors_find(exp, "greedy");
  const mbd_st_entry *ids = mbd_safetensors_find(exp, "input_ids");
  assert_non_null(gr);
  const int64_t G = gr->desc.shape[1] - ids->desc.shape[1];
  assert_int_equal(procs_sh("%s/mambad-run --model %s --input %s --output %s --generate %lld",
                            g_h.bin, tiny, p, out, (long long)G),
                   0);
  assert_int_equal(mbd_safetensors_open(out, &got, &e), 0);
  const mbd_st_entry *tk = mbd_safetensors_find(got, "tokens");
  assert_non_null(tk);
  assert_int_equal(tk->nbytes, gr->nbytes);
  assert_memory_equal(tk->data, gr->data, gr->nbytes);
  mbd_safetensors_destroy(&got);
  mbd_safetensors_destroy(&exp);
  assert_int_equal(procs_sh("%s/mambad-model synth --family mamba2 --shape custom --d-model 64 "
                            "--layers 2 --vocab 300 --out %s/syn",
                            g_h.bin, g_h.dir),
                   0);
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s/in.safetensors --batch 2 --len 5 "
                            "--vocab 300",
                            g_h.bin, g_h.dir),
                   0);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/syn --input %s/in.safetensors --output "
                            "%s/syn.safetensors --generate 3",
                            g_h.bin, g_h.dir, g_h.dir, g_h.dir),
                   0);
}

static int setup(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  if (m2_load(&g_m2)) {
    print_message("mamba2 fixture %s not found under $MBD_FIXTURES_DIR: skipped\n", M2_CASE);
    exit(77);
  }
  snprintf(g_m2arg, sizeof g_m2arg, "m2=%s", g_m2.dir);
  wh_start_broker(&g_h);
  wh_start_worker(&g_h, "wA", "--model", g_m2arg, NULL);
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
  m2_free(&g_m2);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixed_sessions),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_cli),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
