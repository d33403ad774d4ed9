/* An out-of-tree libmambad program: built against an installed tree only
 * (pkg-config or find_package), it includes nothing but <mambad.h>. It waits
 * for a worker to register with the broker at argv[1], runs one f32 GEMM on
 * it and checks the bits against a local one-FMA-per-K reference (the CPU
 * route's f32 contract), then prints "ok <worker> <route id>".
 *   usage: client_smoke ENDPOINT */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mambad.h>

enum { M = 3, N = 5, K = 7 };

static int fail(const char *what, const mbd_error *err) {
  fprintf(stderr, "client_smoke: %s: %s: %s\n", what, mbd_status_name(err->code), err->msg);
  return 1;
}

/* Polls STATUS until a live worker is listed (at most ~30 s). */
static int wait_worker(mbd_client *c, mbd_error *err) {
  for (int i = 0; i < 300; i++) {
    mbd_status_report *r = NULL;
    if (!mbd_client_status(c, &r, err)) {
      int live = 0;
      for (size_t w = 0; w < r->n_workers; w++) live += r->workers[w].alive;
      mbd_status_report_free(&r);
      if (live) return 0;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return mbd_error_set(err, MBD_E_TIMEOUT, "no live worker registered within 30 s");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: client_smoke ENDPOINT (mambad %s)\n", MAMBAD_VERSION);
    return 2;
  }
  float a[M * K], b[N * K], want[M * N];
  for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7) % 11) / 8.0f - 0.5f;
  for (int i = 0; i < N * K; i++) b[i] = (float)((i * 5) % 13) / 16.0f - 0.25f;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int k = 0; k < K; k++) acc = fmaf(a[i * K + k], b[j * K + k], acc);
      want[i * N + j] = acc;
    }

  mbd_error err = {0};
  mbd_client *c = NULL;
  mbd_client_options opt;
  mbd_client_options_init(&opt);
  opt.deadline_ms = 20000;
  if (mbd_client_new(argv[1], &opt, &c, &err)) return fail("connect", &err);
  int rc = 1;
  mbd_tensor_out out;
  memset(&out, 0, sizeof out);
  mbd_tensor_in ta = {.data = a}, tb = {.data = b};
  const int64_t sa[2] = {M, K}, sb[2] = {N, K};
  if (wait_worker(c, &err)) {
    fail("status", &err);
    goto done;
  }
  if (mbd_tensor_desc_make(&ta.desc, MBD_DTYPE_F32, 2, sa, &err) ||
      mbd_tensor_desc_make(&tb.desc, MBD_DTYPE_F32, 2, sb, &err) ||
      mbd_client_gemm(c, NULL, "f32", &ta, &tb, NULL, &out, &err)) {
    fail("gemm", &err);
    goto done;
  }
  if (out.nbytes != sizeof want || memcmp(out.data, want, sizeof want)) {
    fprintf(stderr, "client_smoke: gemm result differs from the local reference (%zu bytes)\n",
            out.nbytes);
    goto done;
  }
  const mbd_reply_meta *m = mbd_client_last_reply(c);
  printf("ok %s %s\n", m->worker, m->route_id);
  rc = 0;
done:
  mbd_tensor_out_release(&out);
  mbd_client_destroy(&c);
  return rc;
}
