/* GPU context rules: mode transitions (refused while capturing or recording;
 * forced cuBLAS math-mode failure rolled back; unverifiable rollback makes the
 * context unusable for GEMM, capture and replay), route identity (equal across
 * contexts and processes, different per mode, dtype and decode path), graph
 * replay refused under a changed route, capture-once-then-replay
 * (mbd_gpu_graph_run), launch recording, frozen scratch, cuBLAS modes run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/route.h"
#include "common/sha256.h"
#include "support/gpu_util.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"

#define CHECK_OK(expr)                                  \
  do {                                                  \
    int rc__ = (expr);                                  \
    if (rc__ != 0) fail_msg("%s: %s", #expr, err.msg);  \
  } while (0)

static mbd_gpu_ctx *new_ctx(mbd_dtype_policy pol, mbd_gemm_mode mode, mbd_gpu_fault fault) {
  mbd_error err;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.policy = pol;
  cfg.mode = mode;
  cfg.fault = fault;
  cfg.scratch_bytes = 4096;
  mbd_gpu_ctx *ctx = NULL;
  CHECK_OK(mbd_gpu_ctx_new(&cfg, &ctx, &err));
  return ctx;
}

static void route_id(mbd_gpu_ctx *ctx, char id[65]) {
  mbd_error err;
  mbd_route_identity r;
  CHECK_OK(mbd_gpu_ctx_route(ctx, &r, &err));
  mbd_route_id_hex(&r, id);
}

/* A small bf16 GEMM problem on a context. */
typedef struct prob {
  void *x, *w, *y;
  mbd_gpu_gemm_args a;
} prob;

static void prob_new(mbd_gpu_ctx *ctx, prob *p, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  mbd_error err;
  size_t xs = (size_t)(m * k) * 2, ws = (size_t)(n * k) * 2;
  void *hx = malloc(xs), *hw = malloc(ws);
  gpu_test_fill(MBD_DTYPE_BF16, (size_t)(m * k), &seed, hx, NULL);
  gpu_test_fill(MBD_DTYPE_BF16, (size_t)(n * k), &seed, hw, NULL);
  CHECK_OK(mbd_gpu_alloc(ctx, xs, &p->x, &err));
  CHECK_OK(mbd_gpu_alloc(ctx, ws, &p->w, &err));
  CHECK_OK(mbd_gpu_alloc(ctx, (size_t)(m * n) * 4, &p->y, &err));
  CHECK_OK(mbd_gpu_upload(ctx, p->x, hx, xs, &err));
  CHECK_OK(mbd_gpu_upload(ctx, p->w, hw, ws, &err));
  free(hx);
  free(hw);
  mbd_gpu_gemm_args a = {MBD_DTYPE_BF16, MBD_DTYPE_F32, m, n, k, p->x, p->w, NULL, p->y, 0};
  p->a = a;
}
static void prob_free(mbd_gpu_ctx *ctx, prob *p) {
  mbd_gpu_free(ctx, p->x);
  mbd_gpu_free(ctx, p->w);
  mbd_gpu_free(ctx, p->y);
}

static void test_mode_refused_while_capturing_or_recording(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  CHECK_OK(mbd_gpu_record_begin(ctx, &err));
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err), MBD_E_STATE);
  assert_non_null(strstr(err.msg, "recorded"));
  CHECK_OK(mbd_gpu_record_end(ctx, &err));
  CHECK_OK(mbd_gpu_graph_begin(ctx, &err));
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_PEDANTIC, &err), MBD_E_STATE);
  assert_non_null(strstr(err.msg, "captured"));
  mbd_gpu_graph *g = NULL;
  CHECK_OK(mbd_gpu_graph_end(ctx, &g, &err));
  mbd_gpu_graph_destroy(&g);
  assert_int_equal(mbd_gpu_ctx_mode(ctx), MBD_GEMM_DETERMINISTIC);
  CHECK_OK(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_PEDANTIC, &err));
  assert_int_equal(mbd_gpu_ctx_mode(ctx), MBD_GEMM_CUBLAS_PEDANTIC);
  mbd_gpu_ctx_destroy(&ctx);
  assert_null(ctx);
}

static void test_math_failure_rolled_back(void **st) {
  (void)st;
  mbd_error err;
  /* set fails once: restored and verified, mode unchanged, context usable */
  mbd_gpu_fault f1 = {1, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, f1);
  char before[65], after[65];
  route_id(ctx, before);
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err), MBD_E_DEVICE);
  assert_non_null(strstr(err.msg, "restored and verified"));
  assert_int_equal(mbd_gpu_ctx_mode(ctx), MBD_GEMM_DETERMINISTIC);
  assert_int_equal(mbd_gpu_ctx_unusable(ctx, NULL), 0);
  route_id(ctx, after);
  assert_string_equal(before, after);
  prob p;
  prob_new(ctx, &p, 5, 64, 32, 1);
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  CHECK_OK(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err)); /* fault consumed */
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
  prob_free(ctx, &p);
  mbd_gpu_ctx_destroy(&ctx);

  /* set succeeds but verification reads a wrong value: rolled back too */
  mbd_gpu_fault f2 = {0, 1};
  ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, f2);
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_PEDANTIC, &err), MBD_E_DEVICE);
  assert_non_null(strstr(err.msg, "reads back"));
  assert_int_equal(mbd_gpu_ctx_mode(ctx), MBD_GEMM_DETERMINISTIC);
  assert_int_equal(mbd_gpu_ctx_unusable(ctx, NULL), 0);
  mbd_gpu_ctx_destroy(&ctx);
}

static void test_unverifiable_rollback_poisons(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_fault f = {1, 1}; /* set fails, and the restore's verification lies */
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, f);
  prob p;
  prob_new(ctx, &p, 3, 64, 32, 2);
  mbd_gpu_graph *g = NULL;
  CHECK_OK(mbd_gpu_graph_begin(ctx, &err));
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  CHECK_OK(mbd_gpu_graph_end(ctx, &g, &err));
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err), MBD_E_UNUSABLE);
  char diag[MBD_ERROR_MSG_MAX];
  snprintf(diag, sizeof diag, "%s", err.msg);
  assert_non_null(strstr(diag, "could not be verified"));
  mbd_error e2;
  assert_int_equal(mbd_gpu_ctx_unusable(ctx, &e2), 1);
  assert_string_equal(e2.msg, diag);
  assert_int_equal(mbd_gpu_gemm(ctx, &p.a, &err), MBD_E_UNUSABLE);
  assert_string_equal(err.msg, diag);
  assert_int_equal(mbd_gpu_graph_begin(ctx, &err), MBD_E_UNUSABLE);
  assert_string_equal(err.msg, diag);
  assert_int_equal(mbd_gpu_graph_launch(ctx, g, &err), MBD_E_UNUSABLE);
  assert_string_equal(err.msg, diag);
  assert_int_equal(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_DETERMINISTIC, &err), MBD_E_UNUSABLE);
  mbd_gpu_graph_destroy(&g);
  prob_free(ctx, &p);
  mbd_gpu_ctx_destroy(&ctx);
}

static void test_route_identity(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *a = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  mbd_gpu_ctx *b = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  mbd_gpu_ctx *c = new_ctx(MBD_POLICY_F16, MBD_GEMM_DETERMINISTIC, nf);
  char ia[65], ib[65], ic[65], ifast[65], iped[65], iback[65];
  route_id(a, ia);
  route_id(b, ib);
  route_id(c, ic);
  assert_string_equal(ia, ib);
  assert_string_not_equal(ia, ic);
  mbd_route_identity r;
  CHECK_OK(mbd_gpu_ctx_route(a, &r, &err));
  assert_int_equal(r.backend, MBD_BACKEND_CUDA);
  assert_string_equal(r.libraries, "");
  assert_true(r.sm_count > 0 && r.cc_major >= 8);
  assert_int_equal(strncmp(r.isa, "sm_", 3), 0);
  char dig[65];
  mbd_gpu_kernel_digest(dig);
  assert_string_equal(r.kernel_digest, dig);
  printf("route %s: isa=%s device=%s cc=%d.%d sms=%d compiler=%s kernels=%.16s\n", ia, r.isa,
         r.device_name, r.cc_major, r.cc_minor, r.sm_count, r.compiler, r.kernel_digest);
  CHECK_OK(mbd_gpu_ctx_set_mode(a, MBD_GEMM_CUBLAS_FAST, &err));
  route_id(a, ifast);
  CHECK_OK(mbd_gpu_ctx_route(a, &r, &err));
  assert_int_equal(strncmp(r.libraries, "cublas ", 7), 0);
  CHECK_OK(mbd_gpu_ctx_set_mode(a, MBD_GEMM_CUBLAS_PEDANTIC, &err));
  route_id(a, iped);
  CHECK_OK(mbd_gpu_ctx_set_mode(a, MBD_GEMM_DETERMINISTIC, &err));
  route_id(a, iback);
  assert_string_not_equal(ia, ifast);
  assert_string_not_equal(ifast, iped);
  assert_string_equal(ia, iback);
  /* the route encodes the kernel digest: a different digest is a different id */
  CHECK_OK(mbd_gpu_ctx_route(a, &r, &err));
  r.kernel_digest[0] = r.kernel_digest[0] == '0' ? '1' : '0';
  char changed[65];
  mbd_route_id_hex(&r, changed);
  assert_string_not_equal(changed, ia);
  /* the decode path is the config's, and part of the id */
  assert_int_equal(r.decode, MBD_DECODE_PERSISTENT);
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.decode = MBD_DECODE_PER_OP;
  mbd_gpu_ctx *d = NULL;
  CHECK_OK(mbd_gpu_ctx_new(&cfg, &d, &err));
  CHECK_OK(mbd_gpu_ctx_route(d, &r, &err));
  assert_int_equal(r.decode, MBD_DECODE_PER_OP);
  char iper_op[65];
  route_id(d, iper_op);
  assert_string_not_equal(iper_op, ia);
  mbd_gpu_ctx_destroy(&d);
  mbd_gpu_ctx_destroy(&a);
  mbd_gpu_ctx_destroy(&b);
  mbd_gpu_ctx_destroy(&c);
}

/* mbd_gpu_graph_run: direct without graphs; captured once, then replayed
 * without calling the body (the same output bytes as the direct run); a
 * body that fails while captured leaves no graph and says what was being
 * captured, and the next call captures anew. */
typedef struct graph_body {
  mbd_gpu_ctx *ctx;
  prob *p;
  int calls, fail;
} graph_body;
static int graph_body_run(void *arg, mbd_error *err) {
  graph_body *b = (graph_body *)arg;
  b->calls++;
  if (b->fail) return mbd_error_set(err, MBD_E_INVALID, "body refused");
  return mbd_gpu_gemm(b->ctx, &b->p->a, err);
}
static void test_graph_run(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  prob p;
  prob_new(ctx, &p, 64, 256, 128, 9);
  const size_t yb = (size_t)(64 * 256) * 4;
  unsigned char *direct = malloc(yb), *replayed = malloc(yb), *zero = calloc(1, yb);
  graph_body b = {ctx, &p, 0, 0};
  mbd_gpu_graph *g = NULL;
  CHECK_OK(mbd_gpu_graph_run(ctx, 0, &g, graph_body_run, &b, "a test graph", &err));
  assert_int_equal(b.calls, 1);
  assert_null(g);
  CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
  CHECK_OK(mbd_gpu_download(ctx, direct, p.y, yb, &err));
  for (int i = 0; i < 2; i++) {
    CHECK_OK(mbd_gpu_upload(ctx, p.y, zero, yb, &err));
    CHECK_OK(mbd_gpu_graph_run(ctx, 1, &g, graph_body_run, &b, "a test graph", &err));
    assert_int_equal(b.calls, 2); /* captured by the first call only */
    assert_non_null(g);
    CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
    CHECK_OK(mbd_gpu_download(ctx, replayed, p.y, yb, &err));
    assert_memory_equal(direct, replayed, yb);
  }
  mbd_gpu_graph *g2 = NULL;
  b.fail = 1;
  assert_int_equal(mbd_gpu_graph_run(ctx, 1, &g2, graph_body_run, &b, "a test graph", &err),
                   MBD_E_INVALID);
  assert_null(g2);
  assert_non_null(strstr(err.msg, "capturing a test graph: body refused"));
  b.fail = 0;
  CHECK_OK(mbd_gpu_graph_run(ctx, 1, &g2, graph_body_run, &b, "a test graph", &err));
  assert_non_null(g2);
  assert_int_equal(b.calls, 4);
  CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
  mbd_gpu_graph_destroy(&g);
  mbd_gpu_graph_destroy(&g2);
  free(direct);
  free(replayed);
  free(zero);
  prob_free(ctx, &p);
  mbd_gpu_ctx_destroy(&ctx);
}

static void test_graph_route_guard_and_recording(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  prob p, q;
  prob_new(ctx, &p, 300, 1100, 520, 3);
  prob_new(ctx, &q, 1, 64, 36, 4);
  CHECK_OK(mbd_gpu_record_begin(ctx, &err));
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  CHECK_OK(mbd_gpu_gemm(ctx, &q.a, &err));
  assert_int_equal(mbd_gpu_graph_begin(ctx, &err), MBD_E_STATE);
  CHECK_OK(mbd_gpu_record_end(ctx, &err));
  assert_int_equal(mbd_gpu_record_count(ctx), 2);
  const mbd_gpu_launch_rec *r0 = mbd_gpu_record_at(ctx, 0), *r1 = mbd_gpu_record_at(ctx, 1);
  assert_int_equal(r0->m, 300);
  assert_int_equal(r0->n, 1100);
  assert_int_equal(r1->m, 1);
  /* sm_90a routes run the wgmma family (slot 7: plain-load producer, M <= 64) */
  mbd_route_identity ri;
  CHECK_OK(mbd_gpu_ctx_route(ctx, &ri, &err));
  int wg = strcmp(ri.isa, "sm_90a") == 0;
  assert_int_equal(strncmp(r0->kernel, wg ? "mbd_wgemm_bf16_" : "mbd_hgemm_bf16_", 15), 0);
  assert_string_equal(r1->kernel, wg ? "mbd_wgemm_bf16_7" : "mbd_hgemm_bf16_s_e"); /* K=36 */
  mbd_gpu_graph *g = NULL;
  CHECK_OK(mbd_gpu_graph_begin(ctx, &err));
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  CHECK_OK(mbd_gpu_graph_end(ctx, &g, &err));
  assert_int_equal(mbd_gpu_graph_launch_count(g), 1);
  assert_string_equal(mbd_gpu_graph_launch_at(g, 0)->kernel, r0->kernel);
  char id[65];
  route_id(ctx, id);
  assert_string_equal(mbd_gpu_graph_route_id(g), id);
  CHECK_OK(mbd_gpu_graph_launch(ctx, g, &err));
  CHECK_OK(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err));
  assert_int_equal(mbd_gpu_graph_launch(ctx, g, &err), MBD_E_STATE);
  assert_non_null(strstr(err.msg, "captured under route"));
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err)); /* cuBLAS path runs */
  CHECK_OK(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_DETERMINISTIC, &err));
  CHECK_OK(mbd_gpu_graph_launch(ctx, g, &err));
  CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
  /* scratch: presized 4096, grows before capture, frozen after */
  assert_int_equal(mbd_gpu_scratch_frozen(ctx), 1);
  void *s = NULL;
  CHECK_OK(mbd_gpu_scratch(ctx, 4096, "small", &s, &err));
  assert_non_null(s);
  assert_int_equal(mbd_gpu_scratch(ctx, 1 << 20, "prefill bf16[64,2048]", &s, &err), MBD_E_STATE);
  assert_non_null(strstr(err.msg, "prefill bf16[64,2048]"));
  mbd_gpu_graph_destroy(&g);
  prob_free(ctx, &p);
  prob_free(ctx, &q);
  mbd_gpu_ctx_destroy(&ctx);

  ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  CHECK_OK(mbd_gpu_scratch(ctx, 1 << 20, "grow", &s, &err)); /* not frozen yet: grows */
  assert_true(mbd_gpu_scratch_capacity(ctx) >= (1u << 20));
  /* bad input is an error, never a crash */
  mbd_gpu_gemm_args bad = {MBD_DTYPE_F16, MBD_DTYPE_F32, 1, 1, 1, s, s, NULL, s, 0};
  assert_int_equal(mbd_gpu_gemm(ctx, &bad, &err), MBD_E_SHAPE); /* dtype vs policy */
  bad.dtype = MBD_DTYPE_BF16;
  assert_int_equal(mbd_gpu_gemm(ctx, &bad, &err), MBD_E_INVALID); /* y aliases x */
  bad.m = 0;
  assert_int_equal(mbd_gpu_gemm(ctx, &bad, &err), MBD_E_SHAPE);
  assert_int_equal(mbd_gpu_gemm(ctx, NULL, &err), MBD_E_INVALID);
  mbd_gpu_ctx_destroy(&ctx);
}

/* Child mode: compute a fixed GEMM, write route id + output bytes to a file. */
static int child_main(const char *path) {
  mbd_error err;
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  prob p;
  prob_new(ctx, &p, 257, 1100, 520, 99);
  CHECK_OK(mbd_gpu_gemm(ctx, &p.a, &err));
  size_t n = (size_t)257 * 1100 * 4;
  char *buf = malloc(n + 65);
  route_id(ctx, buf);
  CHECK_OK(mbd_gpu_download(ctx, buf + 65, p.y, n, &err));
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, n + 65, f) != n + 65) return 1;
  fclose(f);
  free(buf);
  prob_free(ctx, &p);
  mbd_gpu_ctx_destroy(&ctx);
  return 0;
}

static char *g_self;

static void test_two_processes(void **st) {
  (void)st;
  char path[2][64];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    snprintf(path[i], sizeof path[i], "/tmp/mbd_gpu_child_%d_%d.bin", (int)getpid(), i);
    pid[i] = fork();
    assert_true(pid[i] >= 0);
    if (pid[i] == 0) {
      execl("/proc/self/exe", g_self, "--child", path[i], (char *)NULL);
      _exit(127);
    }
  }
  size_t n = (size_t)257 * 1100 * 4 + 65;
  char *b[2];
  for (int i = 0; i < 2; i++) {
    int status = 0;
    assert_int_equal(waitpid(pid[i], &status, 0), pid[i]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(path[i], "rb");
    assert_non_null(f);
    b[i] = malloc(n);
    assert_int_equal(fread(b[i], 1, n, f), n);
    fclose(f);
    unlink(path[i]);
  }
  assert_memory_equal(b[0], b[1], n); /* same route id and same bytes */
  /* and the parent's own context agrees on the route id */
  mbd_gpu_fault nf = {0, 0};
  mbd_gpu_ctx *ctx = new_ctx(MBD_POLICY_BF16, MBD_GEMM_DETERMINISTIC, nf);
  char id[65];
  route_id(ctx, id);
  assert_string_equal(id, b[0]);
  mbd_gpu_ctx_destroy(&ctx);
  free(b[0]);
  free(b[1]);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
  g_self = argv[0];
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mode_refused_while_capturing_or_recording),
      cmocka_unit_test(test_math_failure_rolled_back),
      cmocka_unit_test(test_unverifiable_rollback_poisons),
      cmocka_unit_test(test_route_identity),
      cmocka_unit_test(test_graph_route_guard_and_recording),
      cmocka_unit_test(test_graph_run),
      cmocka_unit_test(test_two_processes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
