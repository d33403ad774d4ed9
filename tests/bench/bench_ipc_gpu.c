/* What a CUDA IPC tensor costs the worker: a GEMM A [16384,4096] f32
 * (256 MiB) x B [256,4096] -> C [16384,256] f32, deterministic route.
 *
 * In-process part, on the worker's own CUDA backend (mbd_backend_cuda_new):
 * a forked child process owns A, B and C in its device memory and exports
 * them (mbd_tensor_device, as a client does); this process opens them through
 * the backend's ipc_map and runs the backend's gemm in place. Rows:
 *  - compute only: mbd_gpu_gemm on device buffers of this process (no IPC);
 *  - IPC in + out, first: the three handles opened, then the GEMM;
 *  - IPC in + out, cached: the handles found in the backend's cache;
 *  - inline: host A and B uploaded, C downloaded (what frames cost the worker);
 *  - ipc_map cached x3: the per-request resolution alone (worker overhead).
 * The IPC result is checked bit for bit against compute only (memcmp).
 *
 * Service part (needs MBD_BIN_DIR and MBD_FIXTURES_DIR, as ctest sets them):
 * the same GEMM through libmambad -> mambad-broker -> mambad-worker
 * --device cuda:0, inline frames vs device in + out, first vs cached, and
 * the results compared bit for bit.
 *
 * Prints a table and the acceptance figures (IPC over compute <= 1 ms,
 * cached resolution <= 5 us); exits 77 without a device, 1 on a wrong
 * result or a failed call. */
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/mambad.h"
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
#include "support/quantile.h"
#include "support/service_gpu.h"

#define M 16384
#define K 4096
#define N 256
#define REPS 20

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const size_t NA = (size_t)M * K * 4, NB = (size_t)N * K * 4, NC = (size_t)M * N * 4;

/* Deterministic operands: small integers / 64, exact in f32. */
static void fill(float *a, float *b) {
  uint64_t s = 12345;
  for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)((int)(sg_rng(&s) % 129) - 64) / 64.f;
  for (size_t i = 0; i < (size_t)N * K; i++) b[i] = (float)((int)(sg_rng(&s) % 129) - 64) / 64.f;
}

/* What the child hands over: the three exported tensors. */
typedef struct handover {
  mbd_tensor_in a, b, c;
} handover;

static void fail_child(const char *what) {
  fprintf(stderr, "client process: %s\n", what);
  _exit(1);
}

/* The client process: owns A, B, C on cuda:0, exports them, then waits
 * until the parent is done (a byte on `done`) before freeing them. */
static void child(int to_parent, int done, const float *a, const float *b) {
  void *da = NULL, *db = NULL, *dc = NULL;
  if (cudaMalloc(&da, NA) || cudaMalloc(&db, NB) || cudaMalloc(&dc, NC)) fail_child("cudaMalloc");
  if (cudaMemcpy(da, a, NA, cudaMemcpyHostToDevice) || cudaMemcpy(db, b, NB, cudaMemcpyHostToDevice))
    fail_child("upload");
  handover h;
  mbd_tensor_desc ad, bd, cd;
  int64_t as[2] = {M, K}, bs[2] = {N, K}, cs[2] = {M, N};
  mbd_error e = {0};
  mbd_tensor_desc_make(&ad, MBD_DTYPE_F32, 2, as, NULL);
  mbd_tensor_desc_make(&bd, MBD_DTYPE_F32, 2, bs, NULL);
  mbd_tensor_desc_make(&cd, MBD_DTYPE_F32, 2, cs, NULL);
  if (mbd_tensor_device(da, &ad, NULL, &h.a, &e) || mbd_tensor_device(db, &bd, NULL, &h.b, &e) ||
      mbd_tensor_device(dc, &cd, NULL, &h.c, &e))
    fail_child(e.msg);
  if (write(to_parent, &h, sizeof h) != (ssize_t)sizeof h) fail_child("write");
  char x;
  if (read(done, &x, 1) < 0) fail_child("read");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  _exit(0);
}

/* The worker-side ref of a client tensor (as the worker decodes it). */
static void ref_of(const mbd_tensor_in *t, const char *name, mbd_tensor_ref *r) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->desc = t->desc;
  r->kind = MBD_TREF_CUDA_IPC;
  memcpy(r->ipc_handle, t->ipc_.mem, sizeof r->ipc_handle);
  r->device = t->ipc_.device;
  r->offset = t->ipc_.offset;
  size_t nb = 0;
  mbd_tensor_desc_nbytes(&t->desc, &nb, NULL);
  r->size = nb;
}

typedef struct figures {
  double compute, first, cached, in_line, resolve_us;
  bool equal;
} figures;

static int in_process(const float *a, const float *b, float *c_want, figures *f) {
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 1;
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    child(up[1], down[0], a, b);
  }
  close(up[1]);
  close(down[0]);
  handover h;
  int rc = 1;
  mbd_error e = {0};
  mbd_backend *be = NULL;
  mbd_gpu_ctx *ctx = NULL;
  void *oa = NULL, *ob = NULL, *oc = NULL;
  float *c = malloc(NC);
  double t[REPS];
  if (!c || read(up[0], &h, sizeof h) != (ssize_t)sizeof h) goto done;
  /* compute only: this process's own buffers, the worker's route */
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = MBD_POLICY_F32;
  if (mbd_gpu_ctx_new(&cc, &ctx, &e) || mbd_gpu_alloc(ctx, NA, &oa, &e) ||
      mbd_gpu_alloc(ctx, NB, &ob, &e) || mbd_gpu_alloc(ctx, NC, &oc, &e) ||
      mbd_gpu_upload(ctx, oa, a, NA, &e) || mbd_gpu_upload(ctx, ob, b, NB, &e))
    goto done;
  mbd_gpu_gemm_args g = {.dtype = MBD_DTYPE_F32, .out_dtype = MBD_DTYPE_F32, .m = M, .n = N,
                         .k = K, .x = oa, .w = ob, .y = oc};
  for (int r = -2; r < REPS; r++) {
    double t0 = now_s();
    if (mbd_gpu_gemm(ctx, &g, &e) || mbd_gpu_ctx_sync(ctx, &e)) goto done;
    if (r >= 0) t[r] = now_s() - t0;
  }
  f->compute = quantile_of(t, REPS, 0.5);
  if (mbd_gpu_download(ctx, c_want, oc, NC, &e)) goto done;
  /* the worker's backend */
  mbd_backend_opts bo = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                         .state_capacity = 1, .max_batch = 1, .device = 0};
  if (mbd_backend_cuda_new(&bo, &be, &e)) goto done;
  mbd_tensor_ref ra, rb, rc_;
  ref_of(&h.a, "a", &ra);
  ref_of(&h.b, "b", &rb);
  ref_of(&h.c, "c", &rc_);
  for (int r = -1; r < REPS; r++) {
    void *pa, *pb, *pc;
    double t0 = now_s();
    if (be->ops->ipc_map(be, &ra, NA, &pa, &e) || be->ops->ipc_map(be, &rb, NB, &pb, &e) ||
        be->ops->ipc_map(be, &rc_, NC, &pc, &e) ||
        be->ops->gemm(be, M, N, K, MBD_DTYPE_F32, pa, MBD_DTYPE_F32, pb, NULL, pc, &e))
      goto done;
    double dt = now_s() - t0;
    if (r < 0) f->first = dt;
    else t[r] = dt;
  }
  f->cached = quantile_of(t, REPS, 0.5);
  {
    void *pc;
    if (be->ops->ipc_map(be, &rc_, NC, &pc, &e) || be->ops->ipc_read(be, &rc_, c, NC, &e))
      goto done;
    f->equal = memcmp(c, c_want, NC) == 0;
  }
  for (int r = 0; r < REPS; r++) {
    void *p;
    double t0 = now_s();
    for (int k = 0; k < 100; k++)
      if (be->ops->ipc_map(be, &ra, NA, &p, &e) || be->ops->ipc_map(be, &rb, NB, &p, &e) ||
          be->ops->ipc_map(be, &rc_, NC, &p, &e))
        goto done;
    t[r] = (now_s() - t0) / 100;
  }
  f->resolve_us = quantile_of(t, REPS, 0.5) * 1e6;
  for (int r = -1; r < 5; r++) {
    double t0 = now_s();
    if (be->ops->gemm(be, M, N, K, MBD_DTYPE_F32, a, MBD_DTYPE_F32, b, NULL, c, &e)) goto done;
    if (r >= 0) t[r] = now_s() - t0;
  }
  f->in_line = quantile_of(t, 5, 0.5);
  rc = 0;
done:
  if (rc) fprintf(stderr, "in-process part: %s\n", e.msg[0] ? e.msg : "setup failed");
  mbd_backend_destroy(&be); /* closes the handles before the child frees */
  if (ctx) {
    mbd_gpu_free(ctx, oa);
    mbd_gpu_free(ctx, ob);
    mbd_gpu_free(ctx, oc);
  }
  mbd_gpu_ctx_destroy(&ctx);
  if (write(down[1], "x", 1) < 0) rc = 1;
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
  close(up[0]);
  close(down[1]);
  free(c);
  return rc;
}

/* The service part: median round trips of inline vs device GEMM requests;
 * 77 when the harness has no binaries or fixture. */
static int service(const float *a, const float *b, const float *c_want, double out[3],
                   bool *equal) {
  wh h;
  int rc = wh_init(&h);
  if (rc) return rc;
  wh_start_broker(&h);
  sg_start_gpu_worker(&h, "gpu0", 0, "8", "8");
  mbd_client *cl = NULL;
  mbd_error e = {0};
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.max_message_bytes = (size_t)1 << 31;
  void *da = NULL, *db = NULL, *dc = NULL;
  double t[REPS];
  rc = 1;
  if (wh_wait_workers(&h, 1, 120000) || mbd_client_new(h.clients, &co, &cl, &e)) goto done;
  mbd_tensor_desc ad, bd, cd;
  int64_t as[2] = {M, K}, bs[2] = {N, K}, cs[2] = {M, N};
  mbd_tensor_desc_make(&ad, MBD_DTYPE_F32, 2, as, NULL);
  mbd_tensor_desc_make(&bd, MBD_DTYPE_F32, 2, bs, NULL);
  mbd_tensor_desc_make(&cd, MBD_DTYPE_F32, 2, cs, NULL);
  mbd_tensor_in ha = {.desc = ad, .data = a}, hb = {.desc = bd, .data = b};
  *equal = true;
  for (int r = -1; r < 5; r++) {
    mbd_tensor_out o;
    double t0 = now_s();
    if (mbd_client_gemm(cl, NULL, "f32", &ha, &hb, NULL, &o, &e)) goto done;
    if (r >= 0) t[r] = now_s() - t0;
    *equal = *equal && o.nbytes == NC && !memcmp(o.data, c_want, NC);
    mbd_tensor_out_release(&o);
  }
  out[0] = quantile_of(t, 5, 0.5);
  if (cudaMalloc(&da, NA) || cudaMalloc(&db, NB) || cudaMalloc(&dc, NC) ||
      cudaMemcpy(da, a, NA, cudaMemcpyHostToDevice) || cudaMemcpy(db, b, NB, cudaMemcpyHostToDevice))
    goto done;
  mbd_tensor_in xa, xb, xc;
  if (mbd_tensor_device(da, &ad, NULL, &xa, &e) || mbd_tensor_device(db, &bd, NULL, &xb, &e) ||
      mbd_tensor_device(dc, &cd, NULL, &xc, &e))
    goto done;
  mbd_call_opts opt = {.output = &xc};
  for (int r = -1; r < REPS; r++) {
    mbd_tensor_out o;
    double t0 = now_s();
    if (mbd_client_gemm(cl, &opt, "f32", &xa, &xb, NULL, &o, &e)) goto done;
    double dt = now_s() - t0;
    mbd_tensor_out_release(&o);
    if (r < 0) out[1] = dt;
    else t[r] = dt;
  }
  out[2] = quantile_of(t, REPS, 0.5);
  {
    float *c = malloc(NC);
    if (!c || cudaMemcpy(c, dc, NC, cudaMemcpyDeviceToHost)) {
      free(c);
      goto done;
    }
    *equal = *equal && !memcmp(c, c_want, NC);
    free(c);
  }
  rc = 0;
done:
  if (rc) fprintf(stderr, "service part: %s\n", e.msg[0] ? e.msg : "setup failed");
  mbd_client_destroy(&cl);
  wh_fini(&h);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return rc;
}

int main(void) {
  /* Counted without initialising CUDA in this process: the child must be
   * forked before it is. */
  pid_t p = fork();
  if (p == 0) _exit(sg_device_count() > 0 ? 0 : 77);
  int st = 0;
  if (p < 0 || waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  float *a = malloc(NA), *b = malloc(NB), *c_want = malloc(NC);
  if (!a || !b || !c_want) return 1;
  fill(a, b);
  figures f = {0};
  if (in_process(a, b, c_want, &f)) return 1;
  double over = (f.cached - f.compute) * 1e3;
  printf("GEMM f32, deterministic: A [%d,%d] (%zu MiB) x B [%d,%d] -> C [%d,%d]\n", M, K,
         NA >> 20, N, K, M, N);
  printf("\nin-process, the worker's CUDA backend (medians of %d)\n", REPS);
  printf("%-34s | %10s | %14s\n", "path", "ms", "over compute");
  printf("%-34s | %10.3f | %14s\n", "compute only (own device buffers)", f.compute * 1e3, "-");
  printf("%-34s | %10.3f | %11.3f ms\n", "IPC in + out, first (open)", f.first * 1e3,
         (f.first - f.compute) * 1e3);
  printf("%-34s | %10.3f | %11.3f ms\n", "IPC in + out, cached handles", f.cached * 1e3, over);
  printf("%-34s | %10.3f | %11.3f ms\n", "inline (upload A, B; download C)", f.in_line * 1e3,
         (f.in_line - f.compute) * 1e3);
  printf("%-34s | %7.2f us |\n", "ipc_map x3, cached (per request)", f.resolve_us);
  printf("IPC result equals compute only (memcmp): %s\n", f.equal ? "yes" : "NO");
  double svc[3] = {0};
  bool svc_equal = false;
  int s = service(a, b, c_want, svc, &svc_equal);
  if (s == 0) {
    printf("\nservice round trip, libmambad -> broker -> worker (medians)\n");
    printf("%-34s | %10s | %14s\n", "path", "ms", "over compute");
    printf("%-34s | %10.3f | %11.3f ms\n", "inline frames", svc[0] * 1e3,
           (svc[0] - f.compute) * 1e3);
    printf("%-34s | %10.3f | %11.3f ms\n", "device in + out, first (open)", svc[1] * 1e3,
           (svc[1] - f.compute) * 1e3);
    printf("%-34s | %10.3f | %11.3f ms\n", "device in + out, cached", svc[2] * 1e3,
           (svc[2] - f.compute) * 1e3);
    printf("service results equal compute only (memcmp): %s\n", svc_equal ? "yes" : "NO");
  } else {
    printf("\nservice part skipped (%s)\n", s == 77 ? "no binaries or fixture" : "failed");
  }
  printf("\nacceptance: IPC over compute %.3f ms (<= 1 ms: %s); cached resolution %.2f us "
         "(<= 5 us: %s)\n",
         over, over <= 1.0 ? "ok" : "OVER", f.resolve_us, f.resolve_us <= 5.0 ? "ok" : "OVER");
  free(a);
  free(b);
  free(c_want);
  return f.equal && (s != 0 || svc_equal) && (s == 0 || s == 77) ? 0 : 1;
}
