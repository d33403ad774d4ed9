/* Mamba-3 SISO CPU model against state-spaces/mamba's float64 reference
 * (../shared/fixtures/mamba3), plus the determinism contract: prefill of T
 * then decode == decode from the start (logits and state bits, several T and
 * chunk sizes), alone == any slot of batches 2..8, run to run, state
 * export/import continuation, and the portable sin/cos/tanh accuracy. Skips
 * (77) when the fixtures are absent. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/model/family.h"
#include "kernels/model/mamba3.h"
#include "kernels/model/mamba3_math.h"
#include "kernels/model/mamba3_synth.h"
#include "support/model_check.h"
#include "support/model_fixture.h"

#define OPS (&mbd_mamba3_cpu_ops)

static const char *const cases[] = {"tiny-d64-s16-c16", "small-d256-s32-c16"};
enum { NCASES = 2 };

static mbd_mamba3_model *load_model(const mf_fixture *f, mbd_dtype dt, int max_rows,
                                    int threads) {
  mbd_mamba3_options o;
  mbd_mamba3_options_default(&o);
  o.dtype = dt;
  o.threads = threads;
  if (max_rows) o.max_rows = max_rows;
  mbd_mamba3_model *m = NULL;
  mbd_error err = {0};
  if (mbd_mamba3_load(f->dir, &o, &m, &err)) fail_msg("load %s: %s", f->dir, err.msg);
  return m;
}

/* The config resolves to the Mamba-3 family through ssm_cfg.layer. */
/* Config parsing: the fixtures' layout with its defaults and the derived
 * widths; refusals naming what is not served (MIMO, attention, an MLP,
 * LayerNorm) and shapes the layout cannot hold. */
static void test_config(void **state) {
  (void)state;
  mbd_mamba3_config c;
  mbd_error err = {0};
  const char *ok = "{\"d_model\":64,\"n_layer\":2,\"vocab_size\":510,"
                   "\"pad_vocab_size_multiple\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\","
                   "\"d_state\":16,\"headdim\":16,\"ngroups\":2}}";
  assert_int_equal(mbd_mamba3_config_parse(ok, strlen(ok), "c", &c, &err), MBD_OK);
  assert_int_equal(c.d_inner, 128); /* expand 2 by default */
  assert_int_equal(c.heads, 8);
  assert_int_equal(c.vocab_padded, 512);
  assert_int_equal(c.angles, 4); /* rope_fraction 0.5 of d_state 16: 4 pairs */
  assert_int_equal(c.d_in_proj, 2 * 128 + 2 * 2 * 16 + 3 * 8 + 4);
  assert_true(c.tie_embeddings && !c.outproj_norm);
  static const struct {
    const char *json;
    int code;
    const char *says;
  } bad[] = {
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\","
       "\"is_mimo\":true}}",
       MBD_E_UNSUPPORTED, "MIMO"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\"},"
       "\"attn_layer_idx\":[0]}",
       MBD_E_UNSUPPORTED, "attention"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"d_intermediate\":128,"
       "\"ssm_cfg\":{\"layer\":\"Mamba3\"}}",
       MBD_E_FORMAT, "d_intermediate"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"rms_norm\":false,"
       "\"ssm_cfg\":{\"layer\":\"Mamba3\"}}",
       MBD_E_UNSUPPORTED, "LayerNorm"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba2\"}}",
       MBD_E_FORMAT, "Mamba3"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\","
       "\"headdim\":48}}",
       MBD_E_FORMAT, "headdim"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\","
       "\"d_state\":15}}",
       MBD_E_FORMAT, "even"},
      {"{\"d_model\":64,\"n_layer\":2,\"vocab_size\":8,\"ssm_cfg\":{\"layer\":\"Mamba3\","
       "\"rope_fraction\":0.25}}",
       MBD_E_FORMAT, "rope_fraction"},
      {"[1]", MBD_E_FORMAT, "JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err = (mbd_error){0};
    assert_int_equal(mbd_mamba3_config_parse(bad[i].json, strlen(bad[i].json), "c", &c, &err),
                     bad[i].code);
    if (!strstr(err.msg, bad[i].says)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].says);
  }
}

static void test_family(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba3", cases[0], &f)) skip();
  const mbd_model_family *fam = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_model_family_detect(f.dir, &fam, &err), 0);
  assert_non_null(fam);
  assert_string_equal(fam->name, "mamba3");
  assert_ptr_equal(fam->cpu, &mbd_mamba3_cpu_ops);
  mbd_mamba3_config c;
  assert_int_equal(mbd_mamba3_config_load(f.dir, &c, &err), 0);
  assert_int_equal(c.heads, 8);
  assert_int_equal(c.angles, 4);
  assert_int_equal(c.vocab_padded, 512);
  mf_fixture_free(&f);
}

/* f32 prefill and step-by-step decode vs the f64 reference at every position,
 * prefill bits == decode bits, greedy tokens exact, greedy logits in
 * tolerance. */
static void check_reference(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba3_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  int B = f->B, T = f->T, V = f->V, G = f->G;
  assert_int_equal(mbd_mamba3_vocab(m), V);
  assert_true(B <= 8);
  float *pre = malloc((size_t)B * T * V * sizeof(float));
  float *dec = malloc((size_t)B * T * V * sizeof(float));
  float *row = malloc((size_t)B * V * sizeof(float));
  mbd_mamba3_state *st[8];
  mbd_error err = {0};
  for (int b = 0; b < B; b++) st[b] = mc_state_new(OPS, m);
  mc_prefill_prompts(OPS, m, (void *const *)st, B, f->ids, T, pre);
  double worst = mc_check_positions(pre, f->logits, B * T, V, 1e-4, f->name);
  for (int b = 0; b < B; b++) {
    void *s = mc_prefill_then_steps(OPS, m, f->ids + b * T, 0, T, 0, dec + (size_t)b * T * V);
    size_t l;
    uint8_t *e = mc_state_image(OPS, st[b], &l);
    mc_check_state(OPS, s, e, l, f->name);
    free(e);
    OPS->state_free(s);
  }
  assert_memory_equal(pre, dec, (size_t)B * T * V * sizeof(float));
  /* greedy: the states hold the prompt; the last prompt logits pick token 0 */
  double gworst = 0;
  int32_t tok[8];
  for (int b = 0; b < B; b++) memcpy(row + (size_t)b * V, pre + ((size_t)b * T + T - 1) * V,
                                     (size_t)V * sizeof(float));
  for (int g = 0; g < G; g++) {
    for (int b = 0; b < B; b++) {
      const float *lg = row + (size_t)b * V;
      double e = mc_rel_err(lg, f->greedy_logits + ((size_t)b * G + g) * V, V);
      if (e > gworst) gworst = e;
      if (e > 1e-4) fail_msg("%s seq %d greedy step %d: rel err %.3g", f->name, b, g, e);
      tok[b] = mc_argmax(lg, V);
      int64_t want = mf_greedy_token(f, b, g);
      if (tok[b] != want)
        fail_msg("%s seq %d greedy token %d: got %d want %lld", f->name, b, g, tok[b],
                 (long long)want);
    }
    assert_int_equal(mbd_mamba3_step(m, st, B, tok, row, &err), 0);
  }
  print_message("%s f32: worst rel err %.3g (prompt), %.3g (greedy logits); prefill == "
                "decode bits; greedy exact\n", f->name, worst, gworst);
  for (int b = 0; b < B; b++) mbd_mamba3_state_destroy(&st[b]);
  free(pre);
  free(dec);
  free(row);
  mbd_mamba3_destroy(&m);
  assert_null(m);
}

static void test_reference(void **state) {
  (void)state;
  mf_for_each_case("mamba3", cases, NCASES, check_reference);
}

/* bf16 weights: within the error of upstream's own bf16 run on the fixture. */
static void check_bf16(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba3_model *m = load_model(f, MBD_DTYPE_BF16, 0, 2);
  size_t n = (size_t)f->B * f->T * f->V;
  float *pre = malloc(n * sizeof(float));
  mbd_mamba3_state *st[8];
  assert_true(f->B <= 8);
  for (int b = 0; b < f->B; b++) st[b] = mc_state_new(OPS, m);
  mc_prefill_prompts(OPS, m, (void *const *)st, f->B, f->ids, f->T, pre);
  double mx = mc_max_abs(f->logits, n);
  double e_up = mc_max_err(f->logits_bf16_triton, f->logits, n);
  double e_us = mc_max_err(pre, f->logits, n);
  print_message("%s bf16: rel err %.3g (upstream's bf16 run: %.3g)\n", f->name, e_us / mx,
                e_up / mx);
  assert_true(e_us <= e_up);
  for (int b = 0; b < f->B; b++) mbd_mamba3_state_destroy(&st[b]);
  free(pre);
  mbd_mamba3_destroy(&m);
}

static void test_bf16(void **state) {
  (void)state;
  mf_for_each_case("mamba3", cases, NCASES, check_bf16);
}

/* Prefill of T tokens (in chunks of max_rows rows) then decode == decode from
 * the start: every logit and the final state, bit for bit. */
static void test_prefill_then_decode(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba3", cases[1], &f)) skip();
  int T = f.T, V = f.V;
  const int32_t *tok = f.ids;
  static const int max_rows[] = {0, 4, 7, 16};
  static const int64_t splits[] = {1, 2, 5, 8, 15, 16, 17, 31, 36};
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  char what[128];
  for (size_t r = 0; r < sizeof max_rows / sizeof max_rows[0]; r++) {
    mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, max_rows[r], 2);
    uint8_t *eref;
    size_t lref;
    mc_run_steps(OPS, m, tok, T, ref, &eref, &lref);
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
      mbd_mamba3_state *s = mc_prefill_then_steps(OPS, m, tok, splits[k], T, 0, got);
      assert_memory_equal(ref, got, (size_t)T * V * sizeof(float));
      snprintf(what, sizeof what, "max_rows %d, prefill %lld", max_rows[r], (long long)splits[k]);
      mc_check_state(OPS, s, eref, lref, what);
      assert_int_equal(mbd_mamba3_state_position(s), T);
      mbd_mamba3_state_destroy(&s);
    }
    free(eref);
    mbd_mamba3_destroy(&m);
  }
  free(ref);
  free(got);
  mf_fixture_free(&f);
}

/* Each sequence alone == the same sequence in any slot of a batch of 2..8 of
 * mixed lengths (prefill ALL and a decode step), and run to run on another
 * model instance with another thread count. */
static void test_batch_invariance(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba3", cases[1], &f)) skip();
  int T = f.T, V = f.V;
  mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mbd_mamba3_model *m1 = load_model(&f, MBD_DTYPE_F32, 0, 1);
  enum { NB = 8 };
  /* each sequence's tokens, then the token of its decode step */
  int32_t toks[NB][65];
  int64_t lens[NB];
  for (int b = 0; b < NB; b++) {
    lens[b] = 3 + (b * 5) % (T - 3);
    for (int t = 0; t < lens[b]; t++) toks[b][t] = f.ids[(b % f.B) * T + (t + 3 * b) % T];
    toks[b][lens[b]] = toks[b][0];
  }
  float *alone = malloc((size_t)NB * 65 * V * sizeof(float));
  float *again = malloc((size_t)65 * V * sizeof(float));
  mc_seq seqs[NB];
  uint8_t *alone_state[NB];
  size_t slen = 0;
  for (int b = 0; b < NB; b++) {
    float *mine = alone + (size_t)b * 65 * V;
    mbd_mamba3_state *s = mc_prefill_then_steps(OPS, m, toks[b], lens[b], lens[b] + 1, 0, mine);
    alone_state[b] = mc_state_image(OPS, s, &slen);
    mbd_mamba3_state_destroy(&s);
    /* run to run, 1 thread vs 2 */
    s = mc_prefill_then_steps(OPS, m1, toks[b], lens[b], lens[b] + 1, 0, again);
    assert_memory_equal(again, mine, (size_t)(lens[b] + 1) * V * sizeof(float));
    mc_check_state(OPS, s, alone_state[b], slen, "1 thread");
    mbd_mamba3_state_destroy(&s);
    seqs[b] = (mc_seq){.tok = toks[b], .len = lens[b], .logits = mine, .state = alone_state[b],
                       .state_len = slen, .next = toks[b][0],
                       .next_logits = mine + (size_t)lens[b] * V};
  }
  for (int n = 2; n <= NB; n++) {
    for (int rot = 0; rot < n; rot++) { /* slot j holds sequence (j + rot) % n */
      mc_seq batch[NB];
      for (int j = 0; j < n; j++) batch[j] = seqs[(j + rot) % n];
      char what[64];
      snprintf(what, sizeof what, "rotation %d", rot);
      mc_check_batch(OPS, m, batch, n, 1, what);
    }
  }
  for (int b = 0; b < NB; b++) free(alone_state[b]);
  free(alone);
  free(again);
  mbd_mamba3_destroy(&m);
  mbd_mamba3_destroy(&m1);
  mf_fixture_free(&f);
}

/* Export mid-sequence, import on another model instance, continue: the same
 * bits as never stopping. A foreign or damaged image is refused. */
static void test_export_import(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba3", cases[0], &f)) skip();
  int T = f.T, V = f.V;
  const int32_t *tok = f.ids;
  mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mbd_mamba3_model *m2 = load_model(&f, MBD_DTYPE_F32, 5, 1);
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  mbd_mamba3_state *sref = mc_prefill_then_steps(OPS, m, tok, 0, T, 0, ref);
  mbd_error err = {0};
  int64_t half = T / 2 + 1;
  mbd_mamba3_state *s = mc_state_new(OPS, m);
  assert_int_equal(mbd_mamba3_prefill(m, &s, 1, &tok, &half, MBD_LOGITS_ALL, got, &err), 0);
  size_t len;
  uint8_t *img = mc_state_image(OPS, s, &len);
  mbd_mamba3_state *s2 = mc_state_new(OPS, m2);
  assert_int_equal(mbd_mamba3_state_import(s2, img, len, &err), 0);
  assert_int_equal(mbd_mamba3_state_position(s2), half);
  const int32_t *rest = tok + half;
  int64_t nrest = T - half;
  assert_int_equal(
      mbd_mamba3_prefill(m2, &s2, 1, &rest, &nrest, MBD_LOGITS_ALL, got + half * V, &err), 0);
  assert_memory_equal(ref, got, (size_t)T * V * sizeof(float));
  size_t l1;
  uint8_t *e1 = mc_state_image(OPS, sref, &l1);
  mc_check_state(OPS, s2, e1, l1, "imported, continued");
  /* wrong family word (Mamba-1's), truncated payload: refused, state kept */
  uint8_t *bad = malloc(len);
  memcpy(bad, img, len);
  bad[28] = 0;
  assert_int_not_equal(mbd_mamba3_state_import(s2, bad, len, &err), 0);
  assert_int_not_equal(mbd_mamba3_state_import(s2, img, len - 4, &err), 0);
  mc_check_state(OPS, s2, e1, l1, "after refused imports");
  free(bad);
  free(e1);
  free(img);
  free(ref);
  free(got);
  mbd_mamba3_state_destroy(&s);
  mbd_mamba3_state_destroy(&s2);
  mbd_mamba3_state_destroy(&sref);
  mbd_mamba3_destroy(&m);
  mbd_mamba3_destroy(&m2);
  mf_fixture_free(&f);
}

/* The portable sin/cos/tanh against double libm over their domains. */
static void test_math(void **state) {
  (void)state;
  double es = 0, et = 0;
  for (float x = -8.0f; x <= 8.0f; x = nextafterf(x, 9.0f) + 1e-5f) {
    float s, c;
    mbd_m3_sincos(x, &s, &c);
    double e = fmax(fabs(s - sin((double)x)), fabs(c - cos((double)x)));
    if (e > es) es = e;
  }
  for (float x = -12.0f; x <= 12.0f; x = nextafterf(x, 13.0f) + 1e-5f) {
    double e = fabs(mbd_m3_tanh(x) - tanh((double)x));
    if (e > et) et = e;
  }
  print_message("sincos max abs err %.3g, tanh %.3g\n", es, et);
  assert_true(es <= 2 * 0x1.0p-24);
  assert_true(et <= 1e-7);
  assert_true(mbd_m3_decay(0.0f, 1e-4f) == -1.0f);
  assert_true(mbd_m3_decay(-1.0f, 1e-4f) == -0.5f);
  assert_true(mbd_m3_decay(-1e9f, 1e-4f) == -1e-4f);
}

/* A synthetic Mamba-3 checkpoint (the synth tool's writer, d_state 128,
 * headdim 64, 32 rotary pairs) loads, and its chunked prefill equals decoding
 * bit for bit; a shape name outside the list is refused. */
static void test_synth(void **state) {
  (void)state;
  mbd_mamba3_config c;
  mbd_error err = {0};
  assert_int_not_equal(mbd_mamba3_synth_shape("9b", 0, 0, 0, &c, &err), 0);
  assert_int_equal(mbd_mamba3_synth_shape("custom", 128, 2, 300, &c, &err), 0);
  char dir[] = "/tmp/mbd-m3synth-XXXXXX";
  assert_non_null(mkdtemp(dir));
  assert_int_equal(mbd_mamba3_synth_write(&c, MBD_DTYPE_F32, 7, dir, &err), 0);
  mbd_mamba3_options o;
  mbd_mamba3_options_default(&o);
  o.threads = 2;
  o.max_rows = 5;
  mbd_mamba3_model *m = NULL;
  if (mbd_mamba3_load(dir, &o, &m, &err)) fail_msg("load synth: %s", err.msg);
  const mbd_mamba3_config *mc = mbd_mamba3_model_config(m);
  assert_int_equal(mc->angles, 32);
  assert_int_equal(mc->heads, 4);
  int V = mbd_mamba3_vocab(m);
  assert_int_equal(V, 304);
  enum { T = 13 };
  int32_t tok[T];
  for (int t = 0; t < T; t++) tok[t] = (t * 37 + 5) % 300;
  float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
  mbd_mamba3_state *s1 = mc_prefill_then_steps(OPS, m, tok, 0, T, 0, a), *s2 = mc_state_new(OPS, m);
  const int32_t *tp = tok;
  int64_t n = T;
  assert_int_equal(mbd_mamba3_prefill(m, &s2, 1, &tp, &n, MBD_LOGITS_ALL, b, &err), 0);
  assert_memory_equal(a, b, (size_t)T * V * sizeof(float));
  for (size_t i = 0; i < (size_t)T * V; i++) assert_true(isfinite(a[i]));
  mbd_mamba3_state_destroy(&s1);
  mbd_mamba3_state_destroy(&s2);
  mbd_mamba3_destroy(&m);
  free(a);
  free(b);
  char p[128];
  snprintf(p, sizeof p, "%s/config.json", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_math),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_family),
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_prefill_then_decode),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_synth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
