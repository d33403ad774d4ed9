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

#include "common/safetensors.h"
#include "kernels/model/family.h"
#include "kernels/model/mamba3.h"
#include "kernels/model/mamba3_math.h"
#include "kernels/model/mamba3_synth.h"

typedef struct fixture {
  char dir[1024];
  int B, T, G, V;
  int32_t *ids;      /* [B*T] */
  float *logits;     /* [B,T,V] */
  float *lbf16;      /* [B,T,V] upstream's bf16 run */
  float *glogits;    /* [B,G,V] */
  int64_t *greedy;   /* [B, T+G] */
} fixture;

static const char *cases[] = {"tiny-d64-s16-c16", "small-d256-s32-c16"};
#define NCASES 2

static float *copy_f32(const mbd_safetensors *st, const char *name) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  assert_non_null(e);
  float *v = malloc(e->nbytes);
  memcpy(v, e->data, e->nbytes);
  return v;
}

static int load_fixture(const char *name, fixture *f) {
  memset(f, 0, sizeof(*f));
  const char *root = getenv("MBD_FIXTURES_DIR");
  if (!root) return -1;
  snprintf(f->dir, sizeof(f->dir), "%s/mamba3/%s", root, name);
  char path[1200];
  snprintf(path, sizeof(path), "%s/expected.safetensors", f->dir);
  mbd_error err = {0};
  mbd_safetensors *st = NULL;
  if (mbd_safetensors_open(path, &st, &err)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(st, "logits");
  const mbd_st_entry *gr = mbd_safetensors_find(st, "greedy");
  assert_non_null(ids);
  assert_non_null(lg);
  assert_non_null(gr);
  f->B = (int)ids->desc.shape[0];
  f->T = (int)ids->desc.shape[1];
  f->V = (int)lg->desc.shape[2];
  f->G = (int)gr->desc.shape[1] - f->T;
  f->ids = malloc((size_t)f->B * f->T * sizeof(int32_t));
  for (int i = 0; i < f->B * f->T; i++) {
    int64_t v;
    memcpy(&v, (const char *)ids->data + 8 * i, 8);
    f->ids[i] = (int32_t)v;
  }
  f->greedy = malloc(gr->nbytes);
  memcpy(f->greedy, gr->data, gr->nbytes);
  f->logits = copy_f32(st, "logits");
  f->lbf16 = copy_f32(st, "logits_bf16_triton");
  f->glogits = copy_f32(st, "greedy_logits");
  mbd_safetensors_destroy(&st);
  return 0;
}

static void free_fixture(fixture *f) {
  free(f->ids);
  free(f->greedy);
  free(f->logits);
  free(f->lbf16);
  free(f->glogits);
}

static int skip_if_absent(fixture *f, const char *name) {
  if (load_fixture(name, f) == 0) return 0;
  print_message("fixture %s not found under $MBD_FIXTURES_DIR: skipped\n", name);
  return 1;
}

static mbd_mamba3_model *load_model(const fixture *f, mbd_dtype dt, int max_rows, int threads) {
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

static mbd_mamba3_state *new_state(const mbd_mamba3_model *m) {
  mbd_mamba3_state *s = NULL;
  mbd_error err = {0};
  if (mbd_mamba3_state_new(m, &s, &err)) fail_msg("state: %s", err.msg);
  return s;
}

static uint8_t *export_state(const mbd_mamba3_state *s, size_t *len) {
  size_t n = mbd_mamba3_state_export_size(s);
  uint8_t *buf = malloc(n);
  mbd_error err = {0};
  assert_int_equal(mbd_mamba3_state_export(s, buf, n, len, &err), 0);
  return buf;
}

static double pos_rel_err(const float *got, const float *ref, int V) {
  double e = 0, mx = 0;
  for (int v = 0; v < V; v++) {
    double d = fabs((double)got[v] - ref[v]);
    if (d > e) e = d;
    if (fabs(ref[v]) > mx) mx = fabs(ref[v]);
  }
  return e / mx;
}

static int argmax(const float *x, int V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (x[v] > x[best]) best = v;
  return best;
}

/* Decodes seq's tokens one step at a time from a fresh state: logits [len, V]. */
static mbd_mamba3_state *decode_only(mbd_mamba3_model *m, const int32_t *tok, int64_t len,
                                     float *logits) {
  mbd_mamba3_state *s = new_state(m);
  mbd_error err = {0};
  int V = mbd_mamba3_vocab(m);
  for (int64_t t = 0; t < len; t++)
    if (mbd_mamba3_step(m, &s, 1, tok + t, logits + t * V, &err)) fail_msg("step: %s", err.msg);
  return s;
}

/* The config resolves to the Mamba-3 family through ssm_cfg.layer. */
static void test_family(void **state) {
  (void)state;
  fixture f;
  if (skip_if_absent(&f, cases[0])) skip();
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
  free_fixture(&f);
}

/* f32 prefill and step-by-step decode vs the f64 reference at every position,
 * prefill bits == decode bits, greedy tokens exact, greedy logits in
 * tolerance. */
static void test_reference(void **state) {
  (void)state;
  int ran = 0;
  for (int c = 0; c < NCASES; c++) {
    fixture f;
    if (skip_if_absent(&f, cases[c])) continue;
    ran++;
    mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
    int B = f.B, T = f.T, V = f.V, G = f.G;
    assert_int_equal(mbd_mamba3_vocab(m), V);
    float *pre = malloc((size_t)B * T * V * sizeof(float));
    float *dec = malloc((size_t)B * T * V * sizeof(float));
    float *row = malloc((size_t)B * V * sizeof(float));
    mbd_mamba3_state *st[8];
    const int32_t *tp[8];
    int64_t lens[8];
    mbd_error err = {0};
    for (int b = 0; b < B; b++) {
      st[b] = new_state(m);
      tp[b] = f.ids + b * T;
      lens[b] = T;
    }
    assert_int_equal(mbd_mamba3_prefill(m, st, B, tp, lens, MBD_LOGITS_ALL, pre, &err), 0);
    double worst = 0;
    for (int p = 0; p < B * T; p++) {
      double e = pos_rel_err(pre + (size_t)p * V, f.logits + (size_t)p * V, V);
      if (e > worst) worst = e;
      if (e > 1e-4) fail_msg("%s position %d: rel err %.3g > 1e-4", cases[c], p, e);
    }
    for (int b = 0; b < B; b++) {
      mbd_mamba3_state *s = decode_only(m, tp[b], T, dec + (size_t)b * T * V);
      size_t l1, l2;
      uint8_t *e1 = export_state(s, &l1), *e2 = export_state(st[b], &l2);
      assert_int_equal(l1, l2);
      assert_memory_equal(e1, e2, l1);
      free(e1);
      free(e2);
      mbd_mamba3_state_destroy(&s);
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
        double e = pos_rel_err(lg, f.glogits + ((size_t)b * G + g) * V, V);
        if (e > gworst) gworst = e;
        if (e > 1e-4) fail_msg("%s seq %d greedy step %d: rel err %.3g", cases[c], b, g, e);
        tok[b] = argmax(lg, V);
        int64_t want = f.greedy[(size_t)b * (T + G) + T + g];
        if (tok[b] != want)
          fail_msg("%s seq %d greedy token %d: got %d want %lld", cases[c], b, g, tok[b],
                   (long long)want);
      }
      assert_int_equal(mbd_mamba3_step(m, st, B, tok, row, &err), 0);
    }
    print_message("%s f32: worst rel err %.3g (prompt), %.3g (greedy logits); prefill == "
                  "decode bits; greedy exact\n", cases[c], worst, gworst);
    for (int b = 0; b < B; b++) mbd_mamba3_state_destroy(&st[b]);
    free(pre);
    free(dec);
    free(row);
    mbd_mamba3_destroy(&m);
    assert_null(m);
    free_fixture(&f);
  }
  if (!ran) skip();
}

/* bf16 weights: within the error of upstream's own bf16 run on the fixture. */
static void test_bf16(void **state) {
  (void)state;
  int ran = 0;
  for (int c = 0; c < NCASES; c++) {
    fixture f;
    if (skip_if_absent(&f, cases[c])) continue;
    ran++;
    mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_BF16, 0, 2);
    size_t n = (size_t)f.B * f.T * f.V;
    float *pre = malloc(n * sizeof(float));
    mbd_mamba3_state *st[8];
    const int32_t *tp[8];
    int64_t lens[8];
    mbd_error err = {0};
    for (int b = 0; b < f.B; b++) {
      st[b] = new_state(m);
      tp[b] = f.ids + b * f.T;
      lens[b] = f.T;
    }
    assert_int_equal(mbd_mamba3_prefill(m, st, f.B, tp, lens, MBD_LOGITS_ALL, pre, &err), 0);
    double mx = 0, e_up = 0, e_us = 0;
    for (size_t i = 0; i < n; i++) {
      if (fabs(f.logits[i]) > mx) mx = fabs(f.logits[i]);
      if (fabs((double)f.lbf16[i] - f.logits[i]) > e_up) e_up = fabs((double)f.lbf16[i] - f.logits[i]);
      if (fabs((double)pre[i] - f.logits[i]) > e_us) e_us = fabs((double)pre[i] - f.logits[i]);
    }
    print_message("%s bf16: rel err %.3g (upstream's bf16 run: %.3g)\n", cases[c], e_us / mx,
                  e_up / mx);
    assert_true(e_us <= e_up);
    for (int b = 0; b < f.B; b++) mbd_mamba3_state_destroy(&st[b]);
    free(pre);
    mbd_mamba3_destroy(&m);
    free_fixture(&f);
  }
  if (!ran) skip();
}

/* Prefill of T tokens (in chunks of max_rows rows) then decode == decode from
 * the start: every logit and the final state, bit for bit. */
static void test_prefill_then_decode(void **state) {
  (void)state;
  fixture f;
  if (skip_if_absent(&f, cases[1])) skip();
  int T = f.T, V = f.V;
  const int32_t *tok = f.ids;
  static const int max_rows[] = {0, 4, 7, 16};
  static const int64_t splits[] = {1, 2, 5, 8, 15, 16, 17, 31, 36};
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  for (size_t r = 0; r < sizeof max_rows / sizeof max_rows[0]; r++) {
    mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, max_rows[r], 2);
    mbd_mamba3_state *sref = decode_only(m, tok, T, ref);
    size_t lref;
    uint8_t *eref = export_state(sref, &lref);
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
      int64_t n = splits[k];
      mbd_mamba3_state *s = new_state(m);
      mbd_error err = {0};
      assert_int_equal(mbd_mamba3_prefill(m, &s, 1, &tok, &n, MBD_LOGITS_ALL, got, &err), 0);
      for (int64_t t = n; t < T; t++)
        assert_int_equal(mbd_mamba3_step(m, &s, 1, tok + t, got + t * V, &err), 0);
      assert_memory_equal(ref, got, (size_t)T * V * sizeof(float));
      size_t l;
      uint8_t *e = export_state(s, &l);
      assert_int_equal(l, lref);
      assert_memory_equal(e, eref, l);
      assert_int_equal(mbd_mamba3_state_position(s), T);
      free(e);
      mbd_mamba3_state_destroy(&s);
    }
    free(eref);
    mbd_mamba3_state_destroy(&sref);
    mbd_mamba3_destroy(&m);
  }
  free(ref);
  free(got);
  free_fixture(&f);
}

/* Each sequence alone == the same sequence in any slot of a batch of 2..8 of
 * mixed lengths (prefill ALL and a decode step), and run to run on another
 * model instance with another thread count. */
static void test_batch_invariance(void **state) {
  (void)state;
  fixture f;
  if (skip_if_absent(&f, cases[1])) skip();
  int T = f.T, V = f.V;
  mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mbd_mamba3_model *m1 = load_model(&f, MBD_DTYPE_F32, 0, 1);
  enum { NB = 8 };
  int32_t toks[NB][64];
  int64_t lens[NB];
  for (int b = 0; b < NB; b++) {
    lens[b] = 3 + (b * 5) % (T - 3);
    for (int t = 0; t < lens[b]; t++) toks[b][t] = f.ids[(b % f.B) * T + (t + 3 * b) % T];
  }
  float *alone = malloc((size_t)NB * 64 * V * sizeof(float));
  float *alone_step = malloc((size_t)NB * V * sizeof(float));
  uint8_t *alone_state[NB];
  size_t slen = 0;
  mbd_error err = {0};
  for (int b = 0; b < NB; b++) {
    const int32_t *tp = toks[b];
    for (int run = 0; run < 2; run++) {
      mbd_mamba3_model *mm = run ? m1 : m;
      float *dst = run ? malloc((size_t)lens[b] * V * sizeof(float)) : alone + (size_t)b * 64 * V;
      mbd_mamba3_state *s = new_state(mm);
      assert_int_equal(mbd_mamba3_prefill(mm, &s, 1, &tp, &lens[b], MBD_LOGITS_ALL, dst, &err), 0);
      int32_t nt = toks[b][0];
      float *sd = run ? malloc((size_t)V * sizeof(float)) : alone_step + (size_t)b * V;
      assert_int_equal(mbd_mamba3_step(mm, &s, 1, &nt, sd, &err), 0);
      uint8_t *e = export_state(s, &slen);
      if (!run) {
        alone_state[b] = e;
      } else { /* run to run, 1 thread vs 2 */
        assert_memory_equal(dst, alone + (size_t)b * 64 * V, (size_t)lens[b] * V * sizeof(float));
        assert_memory_equal(sd, alone_step + (size_t)b * V, (size_t)V * sizeof(float));
        assert_memory_equal(e, alone_state[b], slen);
        free(e);
        free(dst);
        free(sd);
      }
      mbd_mamba3_state_destroy(&s);
    }
  }
  float *all = malloc((size_t)NB * 64 * V * sizeof(float));
  float *step = malloc((size_t)NB * V * sizeof(float));
  for (int n = 2; n <= NB; n++) {
    for (int rot = 0; rot < n; rot++) { /* slot j holds sequence (j + rot) % n */
      mbd_mamba3_state *st[NB];
      const int32_t *tp[NB];
      int64_t ln[NB];
      int32_t nt[NB];
      for (int j = 0; j < n; j++) {
        int b = (j + rot) % n;
        st[j] = new_state(m);
        tp[j] = toks[b];
        ln[j] = lens[b];
        nt[j] = toks[b][0];
      }
      assert_int_equal(mbd_mamba3_prefill(m, st, n, tp, ln, MBD_LOGITS_ALL, all, &err), 0);
      assert_int_equal(mbd_mamba3_step(m, st, n, nt, step, &err), 0);
      int64_t off = 0;
      for (int j = 0; j < n; j++) {
        int b = (j + rot) % n;
        assert_memory_equal(all + off * V, alone + (size_t)b * 64 * V,
                            (size_t)ln[j] * V * sizeof(float));
        assert_memory_equal(step + (size_t)j * V, alone_step + (size_t)b * V,
                            (size_t)V * sizeof(float));
        size_t l;
        uint8_t *e = export_state(st[j], &l);
        assert_memory_equal(e, alone_state[b], l);
        free(e);
        off += ln[j];
        mbd_mamba3_state_destroy(&st[j]);
      }
    }
  }
  for (int b = 0; b < NB; b++) free(alone_state[b]);
  free(all);
  free(step);
  free(alone);
  free(alone_step);
  mbd_mamba3_destroy(&m);
  mbd_mamba3_destroy(&m1);
  free_fixture(&f);
}

/* Export mid-sequence, import on another model instance, continue: the same
 * bits as never stopping. A foreign or damaged image is refused. */
static void test_export_import(void **state) {
  (void)state;
  fixture f;
  if (skip_if_absent(&f, cases[0])) skip();
  int T = f.T, V = f.V;
  const int32_t *tok = f.ids;
  mbd_mamba3_model *m = load_model(&f, MBD_DTYPE_F32, 0, 2);
  mbd_mamba3_model *m2 = load_model(&f, MBD_DTYPE_F32, 5, 1);
  float *ref = malloc((size_t)T * V * sizeof(float));
  float *got = malloc((size_t)T * V * sizeof(float));
  mbd_mamba3_state *sref = decode_only(m, tok, T, ref);
  mbd_error err = {0};
  int64_t half = T / 2 + 1;
  mbd_mamba3_state *s = new_state(m);
  assert_int_equal(mbd_mamba3_prefill(m, &s, 1, &tok, &half, MBD_LOGITS_ALL, got, &err), 0);
  size_t len;
  uint8_t *img = export_state(s, &len);
  mbd_mamba3_state *s2 = new_state(m2);
  assert_int_equal(mbd_mamba3_state_import(s2, img, len, &err), 0);
  assert_int_equal(mbd_mamba3_state_position(s2), half);
  const int32_t *rest = tok + half;
  int64_t nrest = T - half;
  assert_int_equal(
      mbd_mamba3_prefill(m2, &s2, 1, &rest, &nrest, MBD_LOGITS_ALL, got + half * V, &err), 0);
  assert_memory_equal(ref, got, (size_t)T * V * sizeof(float));
  size_t l1, l2;
  uint8_t *e1 = export_state(sref, &l1), *e2 = export_state(s2, &l2);
  assert_memory_equal(e1, e2, l1);
  /* wrong family word (Mamba-1's), truncated payload: refused, state kept */
  uint8_t *bad = malloc(len);
  memcpy(bad, img, len);
  bad[28] = 0;
  assert_int_not_equal(mbd_mamba3_state_import(s2, bad, len, &err), 0);
  assert_int_not_equal(mbd_mamba3_state_import(s2, img, len - 4, &err), 0);
  uint8_t *e3 = export_state(s2, &l2);
  assert_memory_equal(e1, e3, l1);
  free(bad);
  free(e1);
  free(e2);
  free(e3);
  free(img);
  free(ref);
  free(got);
  mbd_mamba3_state_destroy(&s);
  mbd_mamba3_state_destroy(&s2);
  mbd_mamba3_state_destroy(&sref);
  mbd_mamba3_destroy(&m);
  mbd_mamba3_destroy(&m2);
  free_fixture(&f);
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
  mbd_mamba3_state *s1 = decode_only(m, tok, T, a), *s2 = new_state(m);
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
