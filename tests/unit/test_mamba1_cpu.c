/* Mamba-1 CPU model against the Hugging Face fixtures (f64 reference), plus
 * the determinism contract: batch invariance in every slot of batches 2..8,
 * run to run, prefill+decode == decode-only (logits and state bits), chunked
 * == unchunked, state export/import continuation, seeded sampling. Skips (77)
 * when the fixtures are absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/generate.h"
#include "kernels/model/mamba1.h"
#include "support/model_check.h"
#include "support/model_fixture.h"

#define OPS (&mbd_mamba1_cpu_ops)

static const char *const cases[] = {"tiny-d64", "small-d256"};
enum { NCASES = 2 };

static mbd_mamba1_model *load_model(const mf_fixture *f, mbd_dtype dt, int max_rows,
                                    int threads) {
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  o.dtype = dt;
  o.threads = threads;
  if (max_rows) o.max_rows = max_rows;
  mbd_mamba1_model *m = NULL;
  mbd_error err = {0};
  if (mbd_mamba1_load(f->dir, &o, &m, &err)) fail_msg("load %s: %s", f->dir, err.msg);
  return m;
}

/* The fixture's prompts, then f->G greedy tokens each, by generate. */
static int32_t *generate_greedy(mbd_mamba1_model *m, mbd_mamba1_state **st, const mf_fixture *f) {
  assert_true(f->B <= 16);
  int32_t *gen = malloc((size_t)f->B * f->G * sizeof(int32_t));
  const int32_t *tp[16];
  int64_t lens[16];
  for (int b = 0; b < f->B; b++) {
    tp[b] = f->ids + b * f->T;
    lens[b] = f->T;
    mbd_mamba1_state_reset(st[b]);
  }
  mbd_generate_params gp = {.n_new = f->G};
  mbd_sampling_greedy(&gp.sampling);
  mbd_error err = {0};
  assert_int_equal(mbd_mamba1_generate(m, st, f->B, tp, lens, &gp, gen, NULL, &err), 0);
  return gen;
}

/* f32 prefill and step-by-step decode vs the f64 reference at every position;
 * decode logits bit-equal to prefill logits; greedy tokens exact. */
static void check_reference(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba1_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  int B = f->B, T = f->T, V = f->V;
  assert_true(B <= 16);
  float *pre = malloc((size_t)B * T * V * sizeof(float));
  float *dec = malloc((size_t)B * T * V * sizeof(float));
  mbd_mamba1_state *st[16];
  for (int b = 0; b < B; b++) st[b] = mc_state_new(OPS, m);
  mc_prefill_prompts(OPS, m, (void *const *)st, B, f->ids, T, pre);
  for (int b = 0; b < B; b++) mbd_mamba1_state_reset(st[b]);
  mc_decode_prompts(OPS, m, (void *const *)st, B, f->ids, T, dec);
  double worst = mc_check_positions(pre, f->logits, B * T, V, 1e-4, f->name);
  assert_memory_equal(pre, dec, (size_t)B * T * V * sizeof(float));
  print_message("%s f32: worst per-position rel err %.3g (prefill == decode bits)\n", f->name,
                worst);
  int32_t *gen = generate_greedy(m, st, f);
  for (int b = 0; b < B; b++)
    for (int g = 0; g < f->G; g++)
      if (gen[b * f->G + g] != mf_greedy_token(f, b, g))
        fail_msg("%s seq %d greedy token %d: got %d want %lld", f->name, b, g, gen[b * f->G + g],
                 (long long)mf_greedy_token(f, b, g));
  for (int b = 0; b < B; b++) mbd_mamba1_state_destroy(&st[b]);
  free(gen);
  free(pre);
  free(dec);
  mbd_mamba1_destroy(&m);
  assert_null(m);
}

static void test_reference(void **state) {
  (void)state;
  mf_for_each_case("mamba1", cases, NCASES, check_reference);
}

/* Each fixture sequence alone vs in every slot of batches 2..8 among filler
 * sequences of other lengths: logits rows and final state bit-identical. Also
 * run to run, and a model with tiny chunks (max_rows 5) and 1 thread. */
static void check_batch_invariance(const mf_fixture *f, int c) {
  mbd_mamba1_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  mbd_mamba1_model *m2 = load_model(f, MBD_DTYPE_F32, 5, 1);
  /* An 8-token prefix (and one sequence of the larger case) keeps 35
   * batches per sequence affordable in Debug and sanitizer builds. */
  int T = f->T < 8 ? f->T : 8, V = f->V;
  int nseq = c == 0 ? f->B : 1;
  float *alone = malloc((size_t)T * V * sizeof(float));
  /* fillers: lengths T-3..T+4, tokens from a LCG */
  int32_t filler[8][64];
  uint32_t x = 12345;
  for (int i = 0; i < 8; i++)
    for (int t = 0; t < 64; t++)
      filler[i][t] = (int32_t)((x = x * 1664525u + 1013904223u) >> 8) % V;
  char what[128];
  for (int b = 0; b < nseq; b++) {
    const int32_t *tok = f->ids + b * f->T;
    uint8_t *s_alone;
    size_t l_alone;
    mc_run_alone(OPS, m, tok, T, alone, &s_alone, &l_alone);
    snprintf(what, sizeof what, "%s seq %d run to run", f->name, b);
    mc_check_alone(OPS, m, tok, T, alone, NULL, 0, what);
    snprintf(what, sizeof what, "%s seq %d chunks of 5, 1 thread", f->name, b);
    mc_check_alone(OPS, m2, tok, T, alone, s_alone, l_alone, what);
    snprintf(what, sizeof what, "%s seq %d", f->name, b);
    for (int n = 2; n <= 8; n++) {
      for (int slot = 0; slot < n; slot++) {
        mc_seq seqs[8];
        for (int i = 0; i < n; i++)
          seqs[i] = i == slot ? (mc_seq){.tok = tok, .len = T, .logits = alone, .state = s_alone,
                                         .state_len = l_alone}
                              : (mc_seq){.tok = filler[i], .len = T - 3 + (i + n) % 8};
        mc_check_batch(OPS, m, seqs, n, 0, what);
      }
    }
    free(s_alone);
  }
  free(alone);
  mbd_mamba1_destroy(&m);
  mbd_mamba1_destroy(&m2);
}

static void test_batch_invariance(void **state) {
  (void)state;
  mf_for_each_case("mamba1", cases, NCASES, check_batch_invariance);
}

/* Prefill k tokens, then step the rest (also: export after k, import into a
 * fresh state, continue) == step all tokens from scratch: logits and state. */
static void check_prefill_decode_and_export(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba1_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  int T = f->T, V = f->V;
  const int32_t *tok = f->ids;
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  mbd_error err = {0};
  mbd_mamba1_state *s = mc_prefill_then_steps(OPS, m, tok, 0, T, 0, ref);
  size_t lref;
  uint8_t *sref = mc_state_image(OPS, s, &lref);
  assert_int_equal(mbd_mamba1_state_position(s), T);
  for (int k = 1; k < T; k += 3) {
    mbd_mamba1_state_reset(s);
    int64_t len = k;
    assert_int_equal(
        mbd_mamba1_prefill(m, &s, 1, &tok, &len, MBD_MAMBA1_LOGITS_ALL, got, &err), 0);
    /* move the sequence through bytes into a new state, then continue */
    size_t l;
    uint8_t *mid = mc_state_image(OPS, s, &l);
    mbd_mamba1_state *s2 = mc_state_new(OPS, m);
    assert_int_equal(mbd_mamba1_state_import(s2, mid, l, &err), 0);
    assert_int_equal(mbd_mamba1_state_position(s2), k);
    for (int t = k; t < T; t++)
      assert_int_equal(mbd_mamba1_step(m, &s2, 1, tok + t, got + (size_t)t * V, &err), 0);
    assert_memory_equal(got, ref, (size_t)T * V * sizeof(float));
    mc_check_state(OPS, s2, sref, lref, f->name);
    /* corrupt imports are refused and leave the state alone */
    mid[0] ^= 1;
    assert_int_equal(mbd_mamba1_state_import(s2, mid, l, &err), MBD_E_FORMAT);
    assert_int_equal(mbd_mamba1_state_import(s2, mid, 3, &err), MBD_E_FORMAT);
    free(mid);
    mbd_mamba1_state_destroy(&s2);
  }
  free(sref);
  free(ref);
  free(got);
  mbd_mamba1_state_destroy(&s);
  mbd_mamba1_destroy(&m);
}

static void test_prefill_decode_and_export(void **state) {
  (void)state;
  mf_for_each_case("mamba1", cases, NCASES, check_prefill_decode_and_export);
}

/* bf16 (and f16) storage: logits within the fixture's bf16 error scale;
 * greedy agreement reported. */
static void check_low_precision(const mf_fixture *f, int c) {
  (void)c;
  int B = f->B, T = f->T, V = f->V;
  size_t n = (size_t)B * T * V;
  assert_true(B <= 16);
  double torch_err = mc_max_err(f->logits_bf16, f->logits, n);
  mbd_dtype dts[2] = {MBD_DTYPE_BF16, MBD_DTYPE_F16};
  for (int k = 0; k < 2; k++) {
    mbd_mamba1_model *m = load_model(f, dts[k], 0, 2);
    float *lg = malloc(n * sizeof(float));
    mbd_mamba1_state *st[16];
    for (int b = 0; b < B; b++) st[b] = mc_state_new(OPS, m);
    mc_prefill_prompts(OPS, m, (void *const *)st, B, f->ids, T, lg);
    double e = mc_max_err(lg, f->logits, n);
    int32_t *gen = generate_greedy(m, st, f);
    int agree = 0;
    for (int b = 0; b < B; b++)
      for (int g = 0; g < f->G; g++) agree += gen[b * f->G + g] == mf_greedy_token(f, b, g);
    print_message("%s %s: max |logit err| %.4f (torch bf16: %.4f); greedy agreement %d/%d\n",
                  f->name, k ? "f16" : "bf16", e, torch_err, agree, B * f->G);
    /* Our bf16 route keeps activations in f32, so it must not be worse
     * than PyTorch's all-bf16 run (2x margin for a different rounding path). */
    assert_true(e <= 2.0 * torch_err);
    for (int b = 0; b < B; b++) mbd_mamba1_state_destroy(&st[b]);
    free(gen);
    free(lg);
    mbd_mamba1_destroy(&m);
  }
}

static void test_low_precision(void **state) {
  (void)state;
  mf_for_each_case("mamba1", cases, NCASES, check_low_precision);
}

/* Seeded sampling: same seed -> same tokens alone or in a batch; other seed
 * differs; top-k 1 is greedy. Bad ids and bad args are errors, not crashes. */
static void test_sampling_and_errors(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba1", cases[0], &f)) skip();
  mbd_mamba1_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
  int T = f.T, B = f.B, N = 24;
  mbd_mamba1_state *st[8];
  const int32_t *tp[8];
  int64_t lens[8];
  for (int b = 0; b < B; b++) {
    st[b] = mc_state_new(OPS, m);
    tp[b] = f.ids + b * T;
    lens[b] = T;
  }
  uint64_t seeds[8] = {7, 8, 9, 10, 11, 12, 13, 14};
  mbd_generate_params gp = {.n_new = N, .seeds = seeds};
  gp.sampling.temperature = 1.3f;
  gp.sampling.top_k = 50;
  gp.sampling.top_p = 0.95f;
  mbd_error err = {0};
  int32_t batch_out[8 * 64], alone[64], again[64];
  assert_int_equal(mbd_mamba1_generate(m, st, B, tp, lens, &gp, batch_out, NULL, &err), 0);
  for (int b = 0; b < B; b++) {
    mbd_mamba1_state_reset(st[0]);
    mbd_generate_params g1 = gp;
    g1.seeds = &seeds[b];
    assert_int_equal(mbd_mamba1_generate(m, st, 1, &tp[b], &lens[b], &g1, alone, NULL, &err), 0);
    assert_memory_equal(alone, batch_out + b * N, (size_t)N * sizeof(int32_t));
  }
  /* another seed gives another stream */
  mbd_generate_params g2 = gp;
  uint64_t other = 99;
  g2.seeds = &other;
  mbd_mamba1_state_reset(st[0]);
  assert_int_equal(mbd_mamba1_generate(m, st, 1, &tp[0], &lens[0], &g2, again, NULL, &err), 0);
  assert_memory_not_equal(again, batch_out, (size_t)N * sizeof(int32_t));
  /* stop token: generation ends at it, rest is -1 */
  int32_t stop = batch_out[3];
  mbd_generate_params g3 = gp;
  g3.seeds = &seeds[0];
  g3.stop = &stop;
  g3.nstop = 1;
  int64_t count = 0;
  mbd_mamba1_state_reset(st[0]);
  assert_int_equal(mbd_mamba1_generate(m, st, 1, &tp[0], &lens[0], &g3, again, &count, &err), 0);
  int first = 0;
  while (batch_out[first] != stop) first++;
  assert_int_equal(count, first + 1);
  assert_int_equal(again[first + 1 < N ? first + 1 : first], first + 1 < N ? -1 : stop);
  /* errors */
  int32_t bad = f.V;
  assert_int_equal(mbd_mamba1_step(m, st, 1, &bad, NULL, &err), MBD_E_INVALID);
  assert_true(strstr(err.msg, "vocabulary") != NULL);
  bad = -1;
  assert_int_equal(mbd_mamba1_step(m, st, 1, &bad, NULL, &err), MBD_E_INVALID);
  mbd_mamba1_state *dup[2] = {st[0], st[0]};
  int32_t two[2] = {1, 2};
  assert_int_equal(mbd_mamba1_step(m, dup, 2, two, NULL, &err), MBD_E_INVALID);
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  mbd_mamba1_model *none = NULL;
  assert_int_not_equal(mbd_mamba1_load("/nonexistent/model", &o, &none, &err), 0);
  assert_null(none);
  o.backend = MBD_BACKEND_CUDA;
  assert_int_equal(mbd_mamba1_load(f.dir, &o, &none, &err), MBD_E_UNSUPPORTED);
  for (int b = 0; b < B; b++) mbd_mamba1_state_destroy(&st[b]);
  mbd_mamba1_destroy(&m);
  mbd_mamba1_destroy(&m);
  mf_fixture_free(&f);
}

/* The portable build of every kernel gives the same bits as the AVX2 one
 * (fma is exact; vector lanes never span K), so a route's ISA level changes
 * speed, not results. */
static void test_portable_equals_avx2(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba1", cases[1], &f)) skip();
  if (mbd_cpu_isa_detect() != MBD_CPU_ISA_AVX2) {
    mf_fixture_free(&f);
    skip();
  }
  float *a = malloc((size_t)f.T * f.V * sizeof(float));
  float *b = malloc((size_t)f.T * f.V * sizeof(float));
  uint8_t *sa, *sb;
  size_t la, lb;
  for (int k = 0; k < 2; k++) {
    mbd_mamba1_options o;
    mbd_mamba1_options_default(&o);
    o.isa = k ? MBD_CPU_ISA_PORTABLE : MBD_CPU_ISA_AVX2;
    o.dtype = MBD_DTYPE_BF16;
    o.threads = 2;
    mbd_mamba1_model *m = NULL;
    mbd_error err = {0};
    if (mbd_mamba1_load(f.dir, &o, &m, &err)) fail_msg("load: %s", err.msg);
    assert_string_equal(mbd_mamba1_isa(m), k ? "portable" : "x86-64-v3");
    mc_run_alone(OPS, m, f.ids, f.T, k ? b : a, k ? &sb : &sa, k ? &lb : &la);
    mbd_mamba1_destroy(&m);
  }
  assert_memory_equal(a, b, (size_t)f.T * f.V * sizeof(float));
  assert_int_equal(la, lb);
  assert_memory_equal(sa, sb, la);
  free(sa);
  free(sb);
  free(a);
  free(b);
  mf_fixture_free(&f);
}

/* A checkpoint split into two shards with model.safetensors.index.json
 * loads to the same bits as the single file. */
static void test_sharded_load(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba1", cases[0], &f)) skip();
  char tmpl[] = "/tmp/mbd-shard-XXXXXX", path[1200];
  assert_non_null(mkdtemp(tmpl));
  snprintf(path, sizeof(path), "%s/model.safetensors", f.dir);
  mbd_safetensors *src = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open(path, &src, &err), 0);
  size_t n = mbd_safetensors_count(src);
  mbd_st_writer *w[2] = {NULL, NULL};
  assert_int_equal(mbd_st_writer_new(&w[0], &err), 0);
  assert_int_equal(mbd_st_writer_new(&w[1], &err), 0);
  snprintf(path, sizeof(path), "%s/model.safetensors.index.json", tmpl);
  FILE *idx = fopen(path, "w");
  assert_non_null(idx);
  fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
  for (size_t i = 0; i < n; i++) {
    const mbd_st_entry *e = mbd_safetensors_at(src, i);
    int shard = (int)(i % 2);
    assert_int_equal(mbd_st_writer_add(w[shard], e->name, &e->desc, e->data, &err), 0);
    fprintf(idx, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", e->name,
            shard + 1);
  }
  fprintf(idx, "}}\n");
  fclose(idx);
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof(path), "%s/model-0000%d-of-00002.safetensors", tmpl, k + 1);
    assert_int_equal(mbd_st_writer_write(w[k], path, &err), 0);
    mbd_st_writer_destroy(&w[k]);
  }
  char cmd[2400];
  snprintf(cmd, sizeof(cmd), "cp '%s/config.json' '%s/'", f.dir, tmpl);
  assert_int_equal(system(cmd), 0);
  mbd_safetensors_destroy(&src);

  mbd_mamba1_model *m1 = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mf_fixture f2 = f;
  snprintf(f2.dir, sizeof(f2.dir), "%s", tmpl);
  mbd_mamba1_model *m2 = load_model(&f2, MBD_DTYPE_F32, 0, 2);
  float *a = malloc((size_t)f.T * f.V * sizeof(float));
  float *b = malloc((size_t)f.T * f.V * sizeof(float));
  mc_run_alone(OPS, m1, f.ids, f.T, a, NULL, NULL);
  mc_run_alone(OPS, m2, f.ids, f.T, b, NULL, NULL);
  assert_memory_equal(a, b, (size_t)f.T * f.V * sizeof(float));
  free(a);
  free(b);
  mbd_mamba1_destroy(&m1);
  mbd_mamba1_destroy(&m2);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
  assert_int_equal(system(cmd), 0);
  mf_fixture_free(&f);
}

int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. "test_reference" */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_prefill_decode_and_export),
      cmocka_unit_test(test_low_precision),
      cmocka_unit_test(test_sampling_and_errors),
      cmocka_unit_test(test_sharded_load),
      cmocka_unit_test(test_portable_equals_avx2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
