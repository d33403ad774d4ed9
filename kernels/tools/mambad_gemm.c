/* mambad-gemm: runs one GEMM Y[M,N] = A[M,K] B[N,K]^T on cuda:N or cpu, for
 * testing routes by hand, through the backend interface's gemm (the one the
 * worker's GEMM request runs). Inputs come from safetensors files (first
 * tensor of each) or are seeded random; prints the route id (cuda), the time
 * of the call (on cuda: upload, GEMM and download) and a SHA-256 of the output
 * bytes, and optionally writes the output ("y", f32) as safetensors.
 *
 *   mambad-gemm --device cuda:0 --dtype bf16 --mode deterministic --m 64 --n 3072 --k 768
 *               [--a A.safetensors --b B.safetensors --out C.safetensors] [--seed S] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/half.h"
#include "common/route.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "kernels/backend.h"

typedef struct opts {
  const char *device, *dtype, *mode, *a, *b, *out;
  long long m, n, k;
  unsigned seed;
} opts;

static int usage(const char *msg) {
  fprintf(stderr,
          "mambad-gemm: %s\nusage: mambad-gemm --device cuda:N|cpu --dtype f32|tf32|bf16|f16 "
          "--mode deterministic|cublas-fast|cublas-pedantic --m M --n N --k K "
          "[--a A.safetensors --b B.safetensors] [--out C.safetensors] [--seed S]\n",
          msg);
  return 2;
}

static int parse(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->device = "cuda:0";
  o->dtype = "bf16";
  o->mode = NULL; /* --mode, else MBD_GEMM_MODE, else deterministic */
  o->seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage("missing value");
    i++;
    char *end = NULL;
    if (!strcmp(k, "--device")) o->device = v;
    else if (!strcmp(k, "--dtype")) o->dtype = v;
    else if (!strcmp(k, "--mode")) o->mode = v;
    else if (!strcmp(k, "--a")) o->a = v;
    else if (!strcmp(k, "--b")) o->b = v;
    else if (!strcmp(k, "--out")) o->out = v;
    else if (!strcmp(k, "--seed")) o->seed = (unsigned)strtoul(v, &end, 10);
    else if (!strcmp(k, "--m")) o->m = strtoll(v, &end, 10);
    else if (!strcmp(k, "--n")) o->n = strtoll(v, &end, 10);
    else if (!strcmp(k, "--k")) o->k = strtoll(v, &end, 10);
    else return usage("unknown option");
    if (end && *end) return usage("not a number");
  }
  return 0;
}

/* Storage values as f32 (rounded to the storage dtype), from a file or random. */
static int load_input(const char *path, long long rows, long long cols, unsigned *seed,
                      float *out, mbd_error *err) {
  if (!path) {
    for (long long i = 0; i < rows * cols; i++) {
      *seed = *seed * 1664525u + 1013904223u;
      out[i] = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return 0;
  }
  mbd_safetensors *st = NULL;
  int rc = mbd_safetensors_open(path, &st, err);
  if (rc < 0) return rc;
  const mbd_st_entry *e = mbd_safetensors_count(st) ? mbd_safetensors_at(st, 0) : NULL;
  if (!e || e->desc.ndim != 2 || e->desc.shape[0] != rows || e->desc.shape[1] != cols) {
    mbd_safetensors_destroy(&st);
    return mbd_error_set(err, MBD_E_SHAPE, "%s: first tensor must be [%lld,%lld]", path, rows,
                         cols);
  }
  const unsigned char *p = e->data;
  for (long long i = 0; i < rows * cols; i++) {
    if (e->desc.dtype == MBD_DTYPE_F32) memcpy(&out[i], p + 4 * i, 4);
    else {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      out[i] = e->desc.dtype == MBD_DTYPE_BF16 ? mbd_bf16_to_f32(h) : mbd_f16_to_f32(h);
    }
  }
  mbd_safetensors_destroy(&st);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  opts o;
  mbd_error err;
  mbd_error_clear(&err);
  if (parse(argc, argv, &o)) return 2;
  if (o.m < 1 || o.n < 1 || o.k < 1) return usage("--m, --n, --k must be >= 1");
  mbd_dtype_policy pol;
  mbd_gemm_mode mode;
  if (mbd_dtype_policy_parse(o.dtype, &pol, &err) < 0 || mbd_gemm_mode_resolve(o.mode, &mode, &err) < 0)
    return usage(err.msg);
  mbd_dtype dt = pol == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : pol == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                                                                : MBD_DTYPE_F32;
  size_t es = mbd_dtype_size(dt), na = (size_t)(o.m * o.k), nb = (size_t)(o.n * o.k),
         nc = (size_t)(o.m * o.n);
  float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4);
  unsigned char *a16 = malloc(na * es), *b16 = malloc(nb * es);
  int rc = 1;
  if (!a || !b || !c || !a16 || !b16) { fprintf(stderr, "mambad-gemm: out of memory\n"); goto done; }
  unsigned seed = o.seed;
  if (load_input(o.a, o.m, o.k, &seed, a, &err) < 0 || load_input(o.b, o.n, o.k, &seed, b, &err) < 0) {
    fprintf(stderr, "mambad-gemm: %s\n", err.msg);
    goto done;
  }
  for (size_t i = 0; i < na + nb; i++) { /* round to the storage dtype */
    float *v = i < na ? &a[i] : &b[i - na];
    unsigned char *d = i < na ? a16 + i * es : b16 + (i - na) * es;
    if (dt == MBD_DTYPE_F32) { memcpy(d, v, 4); continue; }
    uint16_t h = dt == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(*v) : mbd_f32_to_f16(*v);
    memcpy(d, &h, 2);
    *v = dt == MBD_DTYPE_BF16 ? mbd_bf16_to_f32(h) : mbd_f16_to_f32(h);
  }
  double t0 = 0, t1 = 0;
  char route_id[65] = "";
  mbd_backend_kind kind = MBD_BACKEND_CPU;
  mbd_backend_opts bo = {.mode = mode, .policy = pol, .state_capacity = 1, .max_batch = 1};
  if (!strcmp(o.device, "cpu")) {
    if (pol == MBD_POLICY_TF32 || mode != MBD_GEMM_DETERMINISTIC) {
      fprintf(stderr, "mambad-gemm: the cpu backend runs deterministic f32/bf16/f16 only\n");
      goto done;
    }
  } else if (!strncmp(o.device, "cuda:", 5)) {
    kind = MBD_BACKEND_CUDA;
    bo.device = atoi(o.device + 5);
  } else {
    usage("--device must be cpu or cuda:N");
    goto done;
  }
  mbd_backend *be = NULL;
  if (mbd_backend_new(kind, &bo, &be, &err) < 0) {
    fprintf(stderr, "mambad-gemm: %s\n", err.msg);
    goto done;
  }
  if (kind == MBD_BACKEND_CUDA) {
    mbd_route_identity r;
    be->ops->route(be, &r);
    mbd_route_id_hex(&r, route_id);
  }
  t0 = now_s();
  int g = be->ops->gemm(be, o.m, o.n, o.k, dt, a16, dt, b16, NULL, c, &err);
  t1 = now_s();
  mbd_backend_destroy(&be);
  if (g < 0) {
    fprintf(stderr, "mambad-gemm: %s\n", err.msg);
    goto done;
  }
  uint8_t d[32];
  char hex[65];
  mbd_sha256(c, nc * 4, d);
  mbd_sha256_hex(d, hex);
  printf("device=%s dtype=%s mode=%s m=%lld n=%lld k=%lld time_ms=%.3f\n", o.device, o.dtype,
         mbd_gemm_mode_name(mode), o.m, o.n, o.k, (t1 - t0) * 1e3);
  if (route_id[0]) printf("route_id=%s\n", route_id);
  printf("y_sha256=%s\n", hex);
  if (o.out) {
    mbd_st_writer *w = NULL;
    mbd_tensor_desc desc;
    int64_t shape[2] = {o.m, o.n};
    if (mbd_tensor_desc_make(&desc, MBD_DTYPE_F32, 2, shape, &err) < 0 ||
        mbd_st_writer_new(&w, &err) < 0 || mbd_st_writer_add(w, "y", &desc, c, &err) < 0 ||
        mbd_st_writer_write(w, o.out, &err) < 0) {
      fprintf(stderr, "mambad-gemm: writing %s: %s\n", o.out, err.msg);
      mbd_st_writer_destroy(&w);
      goto done;
    }
    mbd_st_writer_destroy(&w);
  }
  rc = 0;
done:
  free(a);
  free(b);
  free(c);
  free(a16);
  free(b16);
  return rc;
}
