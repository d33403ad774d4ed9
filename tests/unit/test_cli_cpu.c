/* mambad-run / mambad-model end to end: synth a small checkpoint and a prompt
 * file, run prefill + generate, check the output shapes; on the tiny fixture
 * (when present) the generated tokens equal the reference greedy tokens; a
 * row's logits and tokens are the same alone and in the batch; bad inputs
 * exit non-zero with a message; --gemm-mode / --dtype tf32 / --backend cuda
 * without a GPU (or without the CUDA backend) are clear errors. Needs
 * MBD_BIN_DIR (skips otherwise). */
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
#ifdef MBD_HAVE_CUDA
#include "kernels/cuda/gpu_ctx.h"
#endif

static char bin[1024], tmp[64];

static int setup(void **state) {
  (void)state;
  const char *b = getenv("MBD_BIN_DIR");
  if (!b) return 0; /* tests skip */
  snprintf(bin, sizeof(bin), "%s", b);
  snprintf(tmp, sizeof(tmp), "/tmp/mbd-cli-XXXXXX");
  if (!mkdtemp(tmp)) return -1;
  return 0;
}
static int teardown(void **state) {
  (void)state;
  if (tmp[0]) procs_sh("rm -rf '%s'", tmp);
  return 0;
}

/* Skips the calling test, with the reason, when MBD_BIN_DIR is not set. */
static void need_bin(void) {
  if (bin[0]) return;
  print_message("MBD_BIN_DIR is not set (ctest sets it to the built programs)\n");
  skip();
}

static const mbd_st_entry *need(mbd_safetensors *st, const char *name, mbd_dtype dt, int ndim) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  assert_non_null(e);
  assert_int_equal(e->desc.dtype, dt);
  assert_int_equal(e->desc.ndim, ndim);
  return e;
}

static void test_synth_run(void **state) {
  (void)state;
  need_bin();
  assert_int_equal(procs_sh("%s/mambad-model synth --shape custom --d-model 96 --layers 2 "
                            "--vocab 300 --seed 5 --out %s/m 2>/dev/null",
                            bin, tmp),
                   0);
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s/in.safetensors --batch 3 --len 9 "
                            "--vocab 300 --seed 2",
                            bin, tmp),
                   0);
  /* row 1 alone */
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s/in1.safetensors --batch 1 --len 9 "
                            "--vocab 300 --seed 2",
                            bin, tmp),
                   0);
  for (int k = 0; k < 2; k++) {
    const char *extra = k ? "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 11" : "";
    assert_int_equal(procs_sh("%s/mambad-run --model %s/m --input %s/in.safetensors --output "
                              "%s/out.safetensors --generate 6 --threads 2 %s 2>/dev/null",
                              bin, tmp, tmp, tmp, extra),
                     0);
    assert_int_equal(procs_sh("%s/mambad-run --model %s/m --input %s/in1.safetensors --output "
                              "%s/out1.safetensors --generate 6 --threads 1 %s 2>/dev/null",
                              bin, tmp, tmp, tmp, extra),
                     0);
    char p[256], p1[256];
    snprintf(p, sizeof(p), "%s/out.safetensors", tmp);
    snprintf(p1, sizeof(p1), "%s/out1.safetensors", tmp);
    mbd_safetensors *o = NULL, *o1 = NULL;
    mbd_error err = {0};
    assert_int_equal(mbd_safetensors_open(p, &o, &err), 0);
    assert_int_equal(mbd_safetensors_open(p1, &o1, &err), 0);
    const mbd_st_entry *lg = need(o, "logits", MBD_DTYPE_F32, 3);
    const mbd_st_entry *tk = need(o, "tokens", MBD_DTYPE_I64, 2);
    assert_int_equal(lg->desc.shape[0], 3);
    assert_int_equal(lg->desc.shape[1], 9);
    assert_int_equal(lg->desc.shape[2], 300);
    assert_int_equal(tk->desc.shape[1], 15);
    const mbd_st_entry *lg1 = need(o1, "logits", MBD_DTYPE_F32, 3);
    const mbd_st_entry *tk1 = need(o1, "tokens", MBD_DTYPE_I64, 2);
    /* the prompt generator's first row is the same for batch 1 and 3 */
    assert_memory_equal(lg->data, lg1->data, lg1->nbytes);
    assert_memory_equal(tk->data, tk1->data, tk1->nbytes);
    mbd_safetensors_destroy(&o);
    mbd_safetensors_destroy(&o1);
  }
}

static void test_fixture_greedy(void **state) {
  (void)state;
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char exp[1024];
  snprintf(exp, sizeof(exp), "%s/mamba1/tiny-d64/expected.safetensors", fx ? fx : "");
  need_bin();
  if (!fx || access(exp, R_OK) != 0) {
    print_message("fixture %s not found (MBD_FIXTURES_DIR)\n", exp);
    skip();
  }
  mbd_safetensors *e = NULL, *o = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open(exp, &e, &err), 0);
  const mbd_st_entry *gr = need(e, "greedy", MBD_DTYPE_I64, 2);
  const mbd_st_entry *ids = need(e, "input_ids", MBD_DTYPE_I64, 2);
  long long G = (long long)(gr->desc.shape[1] - ids->desc.shape[1]);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/mamba1/tiny-d64 --input %s --output "
                            "%s/fx.safetensors --generate %lld 2>/dev/null",
                            bin, fx, exp, tmp, G),
                   0);
  char p[256];
  snprintf(p, sizeof(p), "%s/fx.safetensors", tmp);
  assert_int_equal(mbd_safetensors_open(p, &o, &err), 0);
  const mbd_st_entry *tk = need(o, "tokens", MBD_DTYPE_I64, 2);
  assert_int_equal(tk->nbytes, gr->nbytes);
  assert_memory_equal(tk->data, gr->data, gr->nbytes);
  mbd_safetensors_destroy(&o);
  mbd_safetensors_destroy(&e);
}

static void test_bad_inputs(void **state) {
  (void)state;
  need_bin();
  assert_int_equal(procs_sh("%s/mambad-run --help >/dev/null", bin), 0);
  assert_int_equal(procs_sh("%s/mambad-run >/dev/null 2>&1", bin), 2);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/nope --input %s/in.safetensors --output "
                            "%s/x.safetensors 2>/dev/null",
                            bin, tmp, tmp, tmp),
                   1);
  /* wrong tensor in input: the model file itself */
  assert_int_equal(procs_sh("%s/mambad-model synth --shape custom --d-model 32 --layers 1 "
                            "--vocab 50 --out %s/m2 2>/dev/null",
                            bin, tmp),
                   0);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/m2 --input %s/m2/model.safetensors --output "
                            "%s/x.safetensors 2>%s/err.txt",
                            bin, tmp, tmp, tmp, tmp),
                   1);
  assert_int_equal(procs_sh("grep -q input_ids %s/err.txt", tmp), 0);
  /* token ids outside the vocabulary */
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s/big.safetensors --batch 1 --len 4 "
                            "--vocab 100000",
                            bin, tmp),
                   0);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/m2 --input %s/big.safetensors --output "
                            "%s/x.safetensors 2>%s/err.txt",
                            bin, tmp, tmp, tmp, tmp),
                   1);
  assert_int_equal(procs_sh("grep -q vocabulary %s/err.txt", tmp), 0);
  assert_int_equal(procs_sh("%s/mambad-run --model %s/m2 --input %s/in.safetensors --output x "
                            "--dtype f64 2>/dev/null",
                            bin, tmp, tmp),
                   2);
  assert_int_equal(procs_sh("%s/mambad-model synth --shape 7b --out %s/q 2>/dev/null", bin, tmp),
                   2);
  assert_int_equal(procs_sh("%s/mambad-model frob 2>/dev/null", bin), 2);
}

/* GPU-only flags on the CPU backend are usage errors naming what is valid;
 * --backend cuda on a machine without a GPU (or in a build without the CUDA
 * backend) fails with a message saying so. */
static void test_backend_flags(void **state) {
  (void)state;
  need_bin();
  assert_int_equal(procs_sh("%s/mambad-model synth --shape custom --d-model 32 --layers 1 "
                            "--vocab 50 --seed 3 --out %s/mb 2>/dev/null",
                            bin, tmp),
                   0);
  assert_int_equal(procs_sh("%s/mambad-model prompt --out %s/inb.safetensors --batch 2 --len 3 "
                            "--vocab 50",
                            bin, tmp),
                   0);
  const char *run = "%s/mambad-run --model %s/mb --input %s/inb.safetensors --output "
                    "%s/ob.safetensors %s 2>%s/errb.txt";
  assert_int_equal(
      procs_sh(run, bin, tmp, tmp, tmp, "--backend cpu --gemm-mode deterministic", tmp), 0);
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--gemm-mode cublas-fast", tmp), 2);
  assert_int_equal(procs_sh("grep -q 'needs --backend cuda' %s/errb.txt", tmp), 0);
  assert_int_equal(procs_sh("grep -q deterministic %s/errb.txt", tmp), 0);
  assert_int_equal(
      procs_sh(run, bin, tmp, tmp, tmp, "--backend cpu --gemm-mode cublas-pedantic", tmp), 2);
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--gemm-mode turbo", tmp), 2);
  assert_int_equal(procs_sh("grep -q cublas-pedantic %s/errb.txt", tmp), 0); /* names all three */
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--dtype tf32", tmp), 2);
  assert_int_equal(procs_sh("grep -q tf32 %s/errb.txt", tmp), 0);
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--backend cuda:zero", tmp), 2);
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--backend tpu", tmp), 2);
  assert_int_equal(procs_sh("grep -q 'cpu, cuda or cuda:N' %s/errb.txt", tmp), 0);
#ifdef MBD_HAVE_CUDA
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  mbd_gpu_ctx *ctx = NULL;
  mbd_error err = {0};
  if (mbd_gpu_ctx_new(&cfg, &ctx, &err) == 0) {
    mbd_gpu_ctx_destroy(&ctx);
    print_message("a CUDA device is present: the no-GPU case is left to tests/gpu/test_run_cli_gpu\n");
    skip();
  }
  assert_non_null(strstr(err.msg, "no CUDA device")); /* this machine has none */
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--backend cuda", tmp), 1);
  assert_int_equal(procs_sh("grep -q 'no CUDA device' %s/errb.txt", tmp), 0);
  assert_int_equal(procs_sh("grep -q 'cuda:0' %s/errb.txt", tmp), 0);
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--backend cuda:1 --dtype bf16", tmp), 1);
  assert_int_equal(procs_sh("grep -q 'no CUDA device' %s/errb.txt", tmp), 0);
#else
  assert_int_equal(procs_sh(run, bin, tmp, tmp, tmp, "--backend cuda", tmp), 2);
  assert_int_equal(procs_sh("grep -q 'no CUDA backend' %s/errb.txt", tmp), 0);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_synth_run),
      cmocka_unit_test(test_fixture_greedy),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_backend_flags),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
