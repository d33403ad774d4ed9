/* Mamba-2 CPU model against the transformers fixtures (f64 reference; for
 * n_groups > 1 the per-group gated norm of mamba_ssm, logits_norm_per_group),
 * and the determinism contract by memcmp: prefill of T tokens then decoding
 * == decoding from the start (T across chunk lengths, non-multiples too),
 * internal chunking, alone vs every slot of batches 2..8 and 256, run to run,
 * threads and ISA, state export/import continuation. Skips when the fixtures
 * are absent. */
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
#include <jansson.h>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/family.h"
#include "kernels/model/mamba2.h"
#include "support/model_check.h"
#include "support/model_fixture.h"

#define OPS (&mbd_mamba2_cpu_ops)

static const char *const cases[] = {"tiny-d64-s16-c8", "small-d256-g2-s32-c16"};
enum { NCASES = 2 };

/* The case's n_groups. Its target is logits_norm_per_group exactly when
 * n_groups > 1 (mamba_ssm's per-group gated norm), else logits. */
static int case_groups(const mf_fixture *f) {
  mbd_mamba2_config cfg;
  mbd_error err = {0};
  if (mbd_mamba2_config_load(f->dir, &cfg, &err)) fail_msg("config: %s", err.msg);
  if ((cfg.n_groups > 1) != (f->logits_norm_per_group != NULL))
    fail_msg("%s: n_groups %d but logits_norm_per_group %s", f->name, cfg.n_groups,
             f->logits_norm_per_group ? "present" : "absent");
  return cfg.n_groups;
}

static mbd_mamba2_model *load_model_isa(const mf_fixture *f, mbd_dtype dt, int max_rows,
                                        int threads, int isa) {
  mbd_mamba2_options o;
  mbd_mamba2_options_default(&o);
  o.dtype = dt;
  o.threads = threads;
  o.isa = isa;
  if (max_rows) o.max_rows = max_rows;
  mbd_mamba2_model *m = NULL;
  mbd_error err = {0};
  if (mbd_mamba2_load(f->dir, &o, &m, &err)) fail_msg("load %s: %s", f->dir, err.msg);
  return m;
}

static mbd_mamba2_model *load_model(const mf_fixture *f, mbd_dtype dt, int max_rows,
                                    int threads) {
  return load_model_isa(f, dt, max_rows, threads, 0);
}

/* f32 prefill and step-by-step decoding vs the reference at every position,
 * decode bits == prefill bits; greedy continuation and its logits. */
static void check_reference(const mf_fixture *f, int c) {
  (void)c;
  int groups = case_groups(f);
  mbd_mamba2_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  int B = f->B, T = f->T, V = f->V, G = f->G;
  assert_int_equal(mbd_mamba2_vocab(m), V);
  assert_true(B <= 8);
  size_t n = (size_t)B * T * V;
  float *pre = malloc(n * sizeof(float)), *dec = malloc(n * sizeof(float));
  float *row = malloc((size_t)V * sizeof(float));
  mbd_mamba2_state *st[8];
  mbd_error err = {0};
  for (int b = 0; b < B; b++) st[b] = mc_state_new(OPS, m);
  mc_prefill_prompts(OPS, m, (void *const *)st, B, f->ids, T, pre);
  for (int b = 0; b < B; b++) mbd_mamba2_state_reset(st[b]);
  mc_decode_prompts(OPS, m, (void *const *)st, B, f->ids, T, dec);
  double worst = mc_check_positions(pre, f->target, B * T, V, 1e-4, f->name);
  assert_memory_equal(pre, dec, n * sizeof(float));
  print_message("%s f32: worst per-position rel err %.3g (prefill == decode bits)\n", f->name,
                worst);
  /* Greedy from the prompt; the continuation and its logits are targets
   * where transformers' norm is the per-group one (n_groups == 1). */
  for (int b = 0; b < B; b++) {
    int next = mc_argmax(pre + ((size_t)b * T + T - 1) * V, V);
    for (int g = 0; g < G; g++) {
      if (groups == 1) {
        if (next != mf_greedy_token(f, b, g))
          fail_msg("%s seq %d greedy token %d: got %d want %lld", f->name, b, g, next,
                   (long long)mf_greedy_token(f, b, g));
        const float *ref = f->greedy_logits + ((size_t)b * G + g) * V;
        const float *got = g == 0 ? pre + ((size_t)b * T + T - 1) * V : row;
        double e = mc_rel_err(got, ref, V);
        if (e > 1e-4) fail_msg("%s seq %d greedy step %d: rel err %.3g", f->name, b, g, e);
      }
      int32_t t1 = next;
      assert_int_equal(mbd_mamba2_step(m, &st[b], 1, &t1, row, &err), 0);
      next = mc_argmax(row, V);
    }
  }
  for (int b = 0; b < B; b++) mbd_mamba2_state_destroy(&st[b]);
  free(pre);
  free(dec);
  free(row);
  mbd_mamba2_destroy(&m);
}

static void test_reference(void **state) {
  (void)state;
  mf_for_each_case("mamba2", cases, NCASES, check_reference);
}

/* bf16 weights: error vs the reference no larger than PyTorch's bf16 run
 * shows (its error measured against transformers' own f64 logits). */
static void check_bf16(const mf_fixture *f, int c) {
  (void)c;
  case_groups(f);
  mbd_mamba2_model *m = load_model(f, MBD_DTYPE_BF16, 0, 2);
  int B = f->B, T = f->T, V = f->V;
  size_t n = (size_t)B * T * V;
  float *got = malloc(n * sizeof(float));
  for (int b = 0; b < B; b++)
    mc_run_alone(OPS, m, f->ids + b * T, T, got + (size_t)b * T * V, NULL, NULL);
  double ours = mc_max_err(got, f->target, n), theirs = mc_max_err(f->logits_bf16, f->logits, n);
  print_message("%s bf16: max abs err %.3g (PyTorch bf16 %.3g)\n", f->name, ours, theirs);
  if (ours > theirs)
    fail_msg("%s bf16 err %.3g > reference bf16 err %.3g", f->name, ours, theirs);
  free(got);
  mbd_mamba2_destroy(&m);
}

static void test_bf16(void **state) {
  (void)state;
  mf_for_each_case("mamba2", cases, NCASES, check_bf16);
}

/* Prefill of the first k tokens (in prefills of `chunk` tokens) then
 * decoding the rest == decoding every token: logits and state bits. */
static void check_prefill_equals_decode(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba2_model *m = load_model(f, MBD_DTYPE_F32, 0, 2);
  int T = f->T, V = f->V;
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  uint8_t *ref_st = NULL;
  size_t ref_len = 0;
  const int32_t *tok = f->ids;
  char what[128];
  mc_run_steps(OPS, m, tok, T, ref, &ref_st, &ref_len);
  const int chunks[] = {1, 2, 3, 5, 7, 8, 13, 16, 64};
  for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
    for (int k = 0; k <= T; k += (k < 4 ? 1 : 6)) {
      void *s = mc_prefill_then_steps(OPS, m, tok, k, T, chunks[ci], got);
      assert_memory_equal(got, ref, (size_t)T * V * sizeof(float));
      snprintf(what, sizeof what, "%s prefill %d in chunks of %d", f->name, k, chunks[ci]);
      mc_check_state(OPS, s, ref_st, ref_len, what);
      OPS->state_free(s);
    }
  }
  /* The model's internal chunking (rows per pass) does not matter either. */
  const int rows[] = {1, 5, 8, 17};
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    mbd_mamba2_model *m2 = load_model(f, MBD_DTYPE_F32, rows[r], 1);
    snprintf(what, sizeof what, "%s %d rows per pass", f->name, rows[r]);
    mc_check_alone(OPS, m2, tok, T, ref, ref_st, ref_len, what);
    mbd_mamba2_destroy(&m2);
  }
  free(ref);
  free(got);
  free(ref_st);
  mbd_mamba2_destroy(&m);
}

static void test_prefill_equals_decode(void **state) {
  (void)state;
  mf_for_each_case("mamba2", cases, NCASES, check_prefill_equals_decode);
}

/* 256 sequences (more than the model's 32 rows per pass): a prefill of all,
 * then one batched step, each sequence's bits as alone. */
static void check_batch_of_256(mbd_mamba2_model *m, int V, const char *name) {
  enum { NB = 256 };
  int32_t (*bt)[7] = malloc(sizeof(int32_t[NB][7]));
  float *one = malloc((size_t)NB * 7 * V * sizeof(float));
  mc_seq *seqs = calloc(NB, sizeof *seqs);
  for (int i = 0; i < NB; i++) {
    int64_t len = 1 + (i * 5) % 6;
    for (int t = 0; t < 7; t++) bt[i][t] = (int32_t)((i * 131 + t * 29 + 3) % V);
    int32_t seq[7];
    memcpy(seq, bt[i], sizeof seq);
    seq[len] = bt[i][6];
    float *alone = one + (size_t)i * 7 * V;
    mc_run_alone(OPS, m, seq, len + 1, alone, NULL, NULL);
    seqs[i] = (mc_seq){.tok = bt[i], .len = len, .logits = alone, .next = bt[i][6],
                       .next_logits = alone + (size_t)len * V};
  }
  mc_check_batch(OPS, m, seqs, NB, 1, name);
  free(bt);
  free(one);
  free(seqs);
}

/* Alone vs every slot of batches 2..8 of sequences of different lengths,
 * run to run, 1 vs 2 threads, portable vs AVX2 ISA. */
static void check_batch_invariance(const mf_fixture *f, int c) {
  (void)c;
  mbd_mamba2_model *m = load_model(f, MBD_DTYPE_F32, 32, 2);
  int T = f->T, V = f->V;
  enum { NSEQ = 8 };
  int32_t seqs[NSEQ][64];
  int64_t lens[NSEQ];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int b = 0; b < NSEQ; b++) {
    lens[b] = 1 + (b * 7 + 3) % T;
    for (int t = 0; t < lens[b]; t++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      seqs[b][t] = b < f->B && t < T ? f->ids[b * T + t] : (int32_t)((x >> 33) % (uint64_t)V);
    }
  }
  float *alone[NSEQ];
  uint8_t *alone_st[NSEQ];
  size_t sl = 0;
  for (int b = 0; b < NSEQ; b++) {
    alone[b] = malloc((size_t)lens[b] * V * sizeof(float));
    mc_run_alone(OPS, m, seqs[b], lens[b], alone[b], &alone_st[b], &sl);
  }
  for (int n = 2; n <= NSEQ; n++) {
    for (int off = 0; off + n <= NSEQ; off += 3) {
      mc_seq batch[NSEQ];
      for (int i = 0; i < n; i++)
        batch[i] = (mc_seq){.tok = seqs[off + i], .len = lens[off + i], .logits = alone[off + i],
                            .state = alone_st[off + i], .state_len = sl};
      char what[128];
      snprintf(what, sizeof what, "%s sequences %d..%d", f->name, off, off + n - 1);
      mc_check_batch(OPS, m, batch, n, 0, what);
    }
  }
  check_batch_of_256(m, V, f->name);
  /* run to run; threads; ISA */
  mbd_mamba2_model *m1 = load_model(f, MBD_DTYPE_F32, 0, 1);
  mbd_mamba2_model *mp = load_model_isa(f, MBD_DTYPE_F32, 0, 2, MBD_CPU_ISA_PORTABLE);
  mbd_mamba2_model *ms[] = {m, m1, mp};
  const char *how[] = {"run to run", "1 thread", "portable"};
  for (int k = 0; k < 3; k++)
    mc_check_alone(OPS, ms[k], seqs[NSEQ - 1], lens[NSEQ - 1], alone[NSEQ - 1], NULL, 0, how[k]);
  mbd_mamba2_destroy(&m1);
  mbd_mamba2_destroy(&mp);
  for (int b = 0; b < NSEQ; b++) {
    free(alone[b]);
    free(alone_st[b]);
  }
  mbd_mamba2_destroy(&m);
}

static void test_batch_invariance(void **state) {
  (void)state;
  mf_for_each_case("mamba2", cases, NCASES, check_batch_invariance);
}

/* Export after k tokens, import on another model instance, continue: the
 * same bits as the uninterrupted run; foreign images are refused. */
static void test_state_roundtrip(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba2", cases[0], &f)) skip();
  mbd_mamba2_model *a = load_model(&f, MBD_DTYPE_F32, 0, 1);
  mbd_mamba2_model *b = load_model(&f, MBD_DTYPE_F32, 0, 2);
  int T = f.T, V = f.V, k = T / 2 + 1;
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  mc_run_alone(OPS, a, f.ids, T, ref, NULL, NULL);
  mbd_mamba2_state *s = mc_state_new(OPS, a), *s2 = mc_state_new(OPS, b);
  mbd_error err = {0};
  const int32_t *p = f.ids;
  int64_t len = k;
  assert_int_equal(mbd_mamba2_prefill(a, &s, 1, &p, &len, MBD_LOGITS_NONE, NULL, &err), 0);
  size_t n = 0;
  uint8_t *img = mc_state_image(OPS, s, &n);
  assert_int_equal(mbd_mamba2_state_import(s2, img, n, &err), 0);
  assert_int_equal(mbd_mamba2_state_position(s2), k);
  p = f.ids + k;
  len = T - k;
  assert_int_equal(mbd_mamba2_prefill(b, &s2, 1, &p, &len, MBD_LOGITS_ALL, got, &err), 0);
  assert_memory_equal(got, ref + (size_t)k * V, (size_t)(T - k) * V * sizeof(float));
  /* refusals leave the state unchanged */
  uint8_t *before = mc_state_image(OPS, s2, &n);
  assert_int_equal(mbd_mamba2_state_import(s2, img, n - 4, &err), MBD_E_FORMAT);
  img[28] = 0; /* family word: Mamba-1 */
  assert_int_not_equal(mbd_mamba2_state_import(s2, img, n, &err), MBD_OK);
  img[28] = 1;
  img[MBD_STATE_IMAGE_HEADER] ^= 1; /* heads */
  assert_int_equal(mbd_mamba2_state_import(s2, img, n, &err), MBD_E_SHAPE);
  uint8_t *after = mc_state_image(OPS, s2, &n);
  assert_memory_equal(before, after, n);
  free(before);
  free(after);
  free(img);
  free(ref);
  free(got);
  mbd_mamba2_state_destroy(&s);
  mbd_mamba2_state_destroy(&s2);
  mbd_mamba2_destroy(&a);
  mbd_mamba2_destroy(&b);
  mf_fixture_free(&f);
}

/* The family table serves model_type mamba2 with this model. */
static void test_family_detect(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba2", cases[0], &f)) skip();
  const mbd_model_family *fam = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_model_family_detect(f.dir, &fam, &err), MBD_OK);
  assert_string_equal(fam->name, "mamba2");
  assert_ptr_equal(fam->cpu, &mbd_mamba2_cpu_ops);
  mf_fixture_free(&f);
}

/* Config parsing: limits, defaults, refusals. */
static void test_config(void **state) {
  (void)state;
  mbd_mamba2_config c;
  mbd_error err = {0};
  const char *ok = "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":16,"
                   "\"n_groups\":2,\"time_step_limit\":[0.001,0.1],\"norm_before_gate\":true}";
  assert_int_equal(mbd_mamba2_config_parse(ok, strlen(ok), "c", &c, &err), MBD_OK);
  assert_int_equal(c.d_inner, 128);
  assert_true(c.dt_min == 0.001f && c.dt_max == 0.1f);
  assert_true(c.norm_before_gate);
  const char *inf = "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":"
                    "16,\"n_groups\":1,\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}]}";
  assert_int_equal(mbd_mamba2_config_parse(inf, strlen(inf), "c", &c, &err), MBD_OK);
  assert_true(c.dt_min == 0.0f && isinf(c.dt_max));
  const char *bad[] = {
      "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":8}",
      "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":16,"
      "\"n_groups\":3}",
      "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":16,"
      "\"n_groups\":1,\"hidden_act\":\"gelu\"}",
      "{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_heads\":8,\"head_dim\":16,"
      "\"n_groups\":1,\"time_step_limit\":[1.0,0.5]}",
      "{\"model_type\":\"mamba\"}",
      "[1]",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_not_equal(mbd_mamba2_config_parse(bad[i], strlen(bad[i]), "c", &c, &err), MBD_OK);
  /* Python's bare Infinity (transformers before 5), in a file: detected and
   * read; "Infinity" inside a string stays a string */
  char dir[] = "/tmp/mbd_m2cfg_XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs("{\"model_type\": \"mamba2\", \"hidden_size\": 64, \"num_heads\": 8, \"head_dim\": "
        "16, \"n_groups\": 1, \"note\": \"Infinity \\\" NaN\",\n \"time_step_limit\": [0.0, "
        "Infinity]}\n",
        fp);
  fclose(fp);
  assert_int_equal(mbd_mamba2_config_load(dir, &c, &err), MBD_OK);
  assert_true(c.dt_min == 0.0f && isinf(c.dt_max));
  const mbd_model_family *fam = NULL;
  assert_int_equal(mbd_model_family_detect(dir, &fam, &err), MBD_OK);
  assert_string_equal(fam->name, "mamba2");
  unlink(path);
  rmdir(dir);
}

/* Synthetic checkpoints: every published shape name, a small custom one
 * written, loaded through the family table's model type and run (prefill ==
 * steps bit for bit), also with n_groups 2. */
static void test_synth(void **state) {
  (void)state;
  mbd_mamba2_config c;
  mbd_error err = {0};
  const char *names[] = {"130m", "370m", "780m", "1.3b", "2.7b"};
  const int dims[] = {768, 1024, 1536, 2048, 2560};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(mbd_mamba2_synth_shape(names[i], &c, &err), MBD_OK);
    assert_int_equal(c.d_model, dims[i]);
    assert_int_equal(c.n_heads * c.head_dim, c.d_inner);
  }
  assert_int_equal(mbd_mamba2_synth_shape("1.4b", &c, &err), MBD_E_INVALID);
  char dir[] = "/tmp/mbd_m2synth_XXXXXX";
  assert_non_null(mkdtemp(dir));
  for (int variant = 0; variant < 2; variant++) {
    mbd_mamba2_synth_custom(64, 2, 300, &c);
    if (variant) {
      c.n_groups = 2;
      c.d_state = 16;
    }
    assert_int_equal(mbd_mamba2_synth_write(&c, MBD_DTYPE_F32, 7, dir, &err), MBD_OK);
    const mbd_model_family *fam = NULL;
    assert_int_equal(mbd_model_family_detect(dir, &fam, &err), MBD_OK);
    assert_string_equal(fam->name, "mamba2");
    mf_fixture f;
    memset(&f, 0, sizeof f);
    snprintf(f.dir, sizeof f.dir, "%s", dir);
    mbd_mamba2_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
    assert_int_equal(mbd_mamba2_model_config(m)->n_groups, c.n_groups);
    int32_t tok[11];
    for (int t = 0; t < 11; t++) tok[t] = (t * 37 + 5) % 300;
    float *a = malloc(11 * 300 * sizeof(float)), *b = malloc(11 * 300 * sizeof(float));
    uint8_t *sa = NULL, *sb = NULL;
    size_t la = 0, lb = 0;
    mc_run_alone(OPS, m, tok, 11, a, &sa, &la);
    mc_run_steps(OPS, m, tok, 11, b, &sb, &lb);
    assert_memory_equal(a, b, 11 * 300 * sizeof(float));
    assert_int_equal(la, lb);
    assert_memory_equal(sa, sb, la);
    for (int i = 0; i < 11 * 300; i++) assert_true(isfinite(a[i]));
    free(a);
    free(b);
    free(sa);
    free(sb);
    mbd_mamba2_destroy(&m);
  }
  char p[64];
  snprintf(p, sizeof p, "%s/config.json", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  rmdir(dir);
}

/* The small fixture rewritten as two shards with an index, untied, its
 * lm_head.weight a copy of the embedding: the same bits as the original. */
static void test_sharded_untied(void **state) {
  (void)state;
  mf_fixture f;
  if (mf_fixture_load("mamba2", cases[1], &f)) skip();
  char dir[] = "/tmp/mbd_m2shard_XXXXXX", path[1200];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
  mbd_safetensors *src = NULL;
  mbd_st_writer *w[2] = {NULL, NULL};
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open(path, &src, &err), 0);
  assert_int_equal(mbd_st_writer_new(&w[0], &err), 0);
  assert_int_equal(mbd_st_writer_new(&w[1], &err), 0);
  json_t *map = json_object();
  for (size_t i = 0; i < mbd_safetensors_count(src); i++) {
    const mbd_st_entry *e = mbd_safetensors_at(src, i);
    assert_int_equal(mbd_st_writer_add(w[i % 2], e->name, &e->desc, e->data, &err), 0);
    json_object_set_new(map, e->name, json_string(i % 2 ? "s1.safetensors" : "s0.safetensors"));
    if (!strcmp(e->name, "backbone.embeddings.weight")) {
      assert_int_equal(mbd_st_writer_add(w[1], "lm_head.weight", &e->desc, e->data, &err), 0);
      json_object_set_new(map, "lm_head.weight", json_string("s1.safetensors"));
    }
  }
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/s%d.safetensors", dir, k);
    assert_int_equal(mbd_st_writer_write(w[k], path, &err), 0);
    mbd_st_writer_destroy(&w[k]);
  }
  mbd_safetensors_destroy(&src);
  json_t *idx = json_pack("{s:o}", "weight_map", map);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  assert_int_equal(json_dump_file(idx, path, 0), 0);
  json_decref(idx);
  snprintf(path, sizeof path, "%s/config.json", f.dir);
  json_t *cfg = json_load_file(path, 0, NULL);
  assert_non_null(cfg);
  json_object_set_new(cfg, "tie_word_embeddings", json_false());
  snprintf(path, sizeof path, "%s/config.json", dir);
  assert_int_equal(json_dump_file(cfg, path, 0), 0);
  json_decref(cfg);
  mbd_mamba2_model *a = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mf_fixture g = f;
  snprintf(g.dir, sizeof g.dir, "%s", dir);
  mbd_mamba2_model *b = load_model(&g, MBD_DTYPE_F32, 0, 2);
  assert_false(mbd_mamba2_model_config(b)->tie_embeddings);
  assert_true(mbd_mamba2_weight_bytes(b) > mbd_mamba2_weight_bytes(a)); /* its own head */
  size_t n = (size_t)f.T * f.V;
  float *la = malloc(n * sizeof(float)), *lb = malloc(n * sizeof(float));
  mc_run_alone(OPS, a, f.ids, f.T, la, NULL, NULL);
  mc_run_alone(OPS, b, f.ids, f.T, lb, NULL, NULL);
  assert_memory_equal(la, lb, n * sizeof(float));
  free(la);
  free(lb);
  mbd_mamba2_destroy(&a);
  mbd_mamba2_destroy(&b);
  const char *files[] = {"s0.safetensors", "s1.safetensors", "model.safetensors.index.json",
                         "config.json"};
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
  mf_fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_family_detect),
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_prefill_equals_decode),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_state_roundtrip),
      cmocka_unit_test(test_synth),
      cmocka_unit_test(test_sharded_untied),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
