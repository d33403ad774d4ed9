/* bench_transfer: what moving a big input tensor through the service costs,
 * inline in message frames vs as a POSIX shm reference. Starts the real
 * mambad-broker and mambad-worker --device cpu (both --max-message-mb 2048 so
 * a 1 GiB frame passes) on ipc:// endpoints, then times a GEMM request
 * C = A B^T with A f32 [M,K] of 1 MiB, 64 MiB and 1 GiB and B [1,K]: N = 1
 * keeps the compute small next to the bytes. The same GEMM is timed
 * in-process (kernels/cpu/gemm.h, same thread count as the worker) so the
 * transfer cost reads as (request - compute). Medians of repeats (fewer for
 * 1 GiB); the service's C is checked bit for bit against the in-process C.
 * Usage: bench_transfer [bin-dir] (default $MBD_BIN_DIR, then build/bin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>

#include "client/mambad.h"
#include "kernels/cpu/gemm.h"
#include "support/procs.h"
#include "support/quantile.h"

enum { K = 4096, THREADS = 2 };

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Waits until the broker lists an alive worker (it registers after start-up). */
static int wait_worker(mbd_client *c) {
  double end = now_ms() + 15000;
  while (now_ms() < end) {
    mbd_status_report *r = NULL;
    int ok = 0;
    if (!mbd_client_status(c, &r, NULL))
      for (size_t i = 0; i < r->n_workers; i++) ok |= r->workers[i].alive;
    mbd_status_report_free(&r);
    if (ok) return 0;
    usleep(100000);
  }
  return -1;
}

/* One request; its wall time in *ms. When want is non-NULL the reply must
 * equal it bit for bit. */
static int request(mbd_client *c, const mbd_tensor_in *a, const mbd_tensor_in *b,
                   const float *want, size_t want_bytes, double *ms) {
  mbd_tensor_out out;
  memset(&out, 0, sizeof out);
  mbd_error err = {0};
  double t0 = now_ms();
  int rc = mbd_client_gemm(c, NULL, "f32", a, b, NULL, &out, &err);
  *ms = now_ms() - t0;
  if (rc) {
    fprintf(stderr, "bench_transfer: gemm request failed: %s\n", err.msg);
    return rc;
  }
  if (want && (out.nbytes != want_bytes || memcmp(out.data, want, want_bytes))) {
    fprintf(stderr, "bench_transfer: service C differs from the in-process C\n");
    rc = -1;
  }
  mbd_tensor_out_release(&out);
  return rc;
}

int main(int argc, char **argv) {
  int rc = 1;
  const char *bin = argc > 1 ? argv[1] : getenv("MBD_BIN_DIR");
  if (!bin) bin = "build/bin";
  char broker[600], worker[600], dir[] = "/tmp/mbd-xfer-XXXXXX", cep[128], wep[128];
  snprintf(broker, sizeof broker, "%s/mambad-broker", bin);
  snprintf(worker, sizeof worker, "%s/mambad-worker", bin);
  if (access(broker, X_OK) || access(worker, X_OK)) {
    fprintf(stderr, "bench_transfer: no mambad-broker/mambad-worker in %s: pass the bin dir\n", bin);
    return 1;
  }
  if (!mkdtemp(dir)) return 1;
  snprintf(cep, sizeof cep, "ipc://%s/c", dir);
  snprintf(wep, sizeof wep, "ipc://%s/w", dir);
  char *bargv[] = {broker, "--clients", cep, "--workers", wep, "--max-message-mb", "2048",
                   "--default-deadline-ms", "600000", NULL};
  char *wargv[] = {worker, "--connect", wep, "--name", "xfer", "--device", "cpu",
                   "--threads", "2", "--max-message-mb", "2048", NULL};
  pid_t bp = procs_spawn(bargv, NULL), wp = procs_spawn(wargv, NULL);

  mbd_client *c = NULL;
  mbd_cpu_ctx *ctx = NULL;
  mbd_shm *shm = NULL;
  float *A = NULL, *B = NULL, *C = NULL;
  mbd_error err = {0};
  const size_t max_bytes = (size_t)1 << 30;
  if (mbd_client_new(cep, NULL, &c, &err) || wait_worker(c)) {
    fprintf(stderr, "bench_transfer: no worker registered with the broker: %s\n", err.msg);
    goto fail;
  }
  if (mbd_cpu_ctx_new(THREADS, MBD_CPU_ISA_AUTO, &ctx, &err) ||
      mbd_shm_create(NULL, max_bytes, &shm, &err)) {
    fprintf(stderr, "bench_transfer: %s\n", err.msg);
    goto fail;
  }
  A = malloc(max_bytes);
  B = malloc(K * sizeof *B);
  C = malloc(max_bytes / K);
  if (!A || !B || !C) goto fail;
  for (size_t i = 0; i < max_bytes / sizeof *A; i++) A[i] = (float)(i % 251) * 0x1p-7f - 1.0f;
  for (int i = 0; i < K; i++) B[i] = (float)(i % 13) * 0x1p-3f;
  memcpy(mbd_shm_data(shm), A, max_bytes);

  printf("GEMM C[M,1] = A[M,%d] B[1,%d]^T, f32, through broker + CPU worker (%d threads), "
         "ipc://, medians; isa %s\n",
         K, K, THREADS, mbd_cpu_isa_name(mbd_cpu_ctx_isa(ctx)));
  printf("  A size    reps   inline ms    shm ms   compute ms   inline xfer ms   shm xfer ms"
         "   inline/shm xfer\n");
  static const size_t sizes[] = {(size_t)1 << 20, (size_t)64 << 20, (size_t)1 << 30};
  static const int reps[] = {21, 7, 3};
  static const char *names[] = {"1 MiB", "64 MiB", "1 GiB"};
  for (int s = 0; s < 3; s++) {
    int64_t M = (int64_t)(sizes[s] / (K * sizeof(float)));
    int64_t sa[2] = {M, K}, sb[2] = {1, K};
    mbd_tensor_in a_in, a_shm, b_in;
    memset(&a_in, 0, sizeof a_in);
    memset(&b_in, 0, sizeof b_in);
    mbd_tensor_desc_make(&a_in.desc, MBD_DTYPE_F32, 2, sa, NULL);
    mbd_tensor_desc_make(&b_in.desc, MBD_DTYPE_F32, 2, sb, NULL);
    a_in.data = A;
    b_in.data = B;
    if (mbd_shm_tensor(shm, 0, &a_in.desc, &a_shm, &err)) {
      fprintf(stderr, "bench_transfer: %s\n", err.msg);
      goto fail;
    }
    double tc[21], ti[21], ts[21];
    int n = reps[s];
    for (int r = 0; r <= n; r++) { /* r == 0 warms up (pages, worker buffers) */
      double t0 = now_ms();
      if (mbd_cpu_gemm(ctx, MBD_GEMM_NT, M, 1, K, MBD_DTYPE_F32, A, K, MBD_DTYPE_F32, B, K, NULL,
                       C, 1, &err)) {
        fprintf(stderr, "bench_transfer: in-process gemm: %s\n", err.msg);
        goto fail;
      }
      double dc = now_ms() - t0, di, ds;
      size_t cb = (size_t)M * sizeof *C;
      if (request(c, &a_in, &b_in, C, cb, &di) || request(c, &a_shm, &b_in, C, cb, &ds)) goto fail;
      if (r) {
        tc[r - 1] = dc;
        ti[r - 1] = di;
        ts[r - 1] = ds;
      }
    }
    double mc = quantile_of(tc, (size_t)n, 0.5), mi = quantile_of(ti, (size_t)n, 0.5),
           ms = quantile_of(ts, (size_t)n, 0.5);
    printf("  %-7s  %4d   %9.2f  %8.2f   %10.2f   %14.2f   %11.2f   %15.1f\n", names[s], n, mi,
           ms, mc, mi - mc, ms - mc, (ms - mc) > 0 ? (mi - mc) / (ms - mc) : 0.0);
    fflush(stdout);
  }
  rc = 0;
fail:
  free(C);
  free(B);
  free(A);
  mbd_shm_destroy(&shm);
  mbd_cpu_ctx_destroy(&ctx);
  mbd_client_destroy(&c);
  procs_stop(wp, SIGTERM, 10000, NULL);
  procs_stop(bp, SIGTERM, 10000, NULL);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) rc = rc ? rc : 1;
  return rc;
}
