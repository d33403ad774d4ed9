/* mambad-run: runs a Mamba-1 model in this process on a file of token ids.
 *   mambad-run --model DIR --input IN.safetensors --output OUT.safetensors
 *              [--backend cpu|cuda|cuda:N] [--dtype f32|tf32|bf16|f16]
 *              [--gemm-mode deterministic|cublas-fast|cublas-pedantic]
 *              [--threads N] [--isa auto|portable|avx2]
 *              [--generate N] [--temperature T --top-k K --top-p P --seed S] [--stop ID]...
 * IN holds input_ids I64 [B,T]; OUT gets logits F32 [B,T,V] and, with
 * --generate, tokens I64 [B,T+N] (greedy unless --temperature > 0; every row
 * samples with the same seed, so a row's tokens do not depend on its slot;
 * after a --stop token the row is padded with -1). The CPU backend runs in
 * this file; the CUDA one in worker/run_cuda.c (CUDA builds only).
 * Exit 0 ok, 1 error, 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/generate.h"
#include "kernels/model/mamba1.h"
#ifdef MBD_HAVE_CUDA
#include "worker/run_cuda.h"
#endif

#define MAX_STOP 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad-run --model DIR --input IN.safetensors --output OUT.safetensors\n"
          "                  [--backend cpu|cuda|cuda:N] [--dtype f32|tf32|bf16|f16]\n"
          "                  [--gemm-mode deterministic|cublas-fast|cublas-pedantic]\n"
          "                  [--threads N] [--isa auto|portable|avx2] [--generate N]\n"
          "                  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop ID]...\n"
          "  IN:  input_ids I64 [B,T] (e.g. from `mambad-model prompt`)\n"
          "  OUT: logits F32 [B,T,V]; with --generate N also tokens I64 [B,T+N]\n"
          "       (greedy unless --temperature > 0; rows after a --stop token are padded with -1)\n"
          "  DIR: Hugging Face Mamba-1 checkpoint (config.json + model.safetensors)\n"
          "  cpu: --dtype f32|bf16|f16, --gemm-mode deterministic, --threads/--isa apply\n"
          "  cuda:N (cuda = cuda:0): every --dtype and --gemm-mode; greedy tokens are\n"
          "       picked on the device, sampled ones by the CPU sampler\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_ll(const char *flag, const char *s, long long lo, long long hi, long long *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s ? s : "", &end, 10);
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "mambad-run: %s needs an integer in [%lld, %lld], got '%s'\n", flag, lo, hi,
            s ? s : "(nothing)");
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_f(const char *flag, const char *s, float *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s ? s : "", &end);
  if (!s || !*s || *end || errno || !isfinite(v)) {
    fprintf(stderr, "mambad-run: %s needs a number, got '%s'\n", flag, s ? s : "(nothing)");
    return -1;
  }
  *out = (float)v;
  return 0;
}


/* --backend cpu | cuda | cuda:N (cuda = cuda:0); -1 with a message when bad. */
static int parse_backend(const char *s, mbd_backend_kind *kind, int *device) {
  long long d = 0;
  mbd_error err = {0};
  if (s && !strncmp(s, "cuda:", 5)) {
    if (parse_ll("--backend cuda:N", s + 5, 0, 1023, &d)) return -1;
    *kind = MBD_BACKEND_CUDA;
  } else if (mbd_backend_parse(s, kind, &err)) {
    fprintf(stderr, "mambad-run: --backend must be cpu, cuda or cuda:N (got '%s')\n",
            s ? s : "(nothing)");
    return -1;
  }
  *device = (int)d;
  return 0;
}

/* Prefill, then generate when gp->n_new > 0, on the CPU model: one state per
 * row, all rows in one batch. */
static int run_cpu(mbd_mamba1_model *m, int64_t B, int64_t T, const int32_t *ids,
                   mbd_generate_params *gp, float *logits, int32_t *gen, double *t_prefill,
                   double *t_gen, mbd_error *err) {
  const int64_t V = mbd_mamba1_vocab(m);
  int rc = MBD_OK;
  const int32_t **tp = calloc((size_t)B, sizeof(*tp));
  int64_t *lens = calloc((size_t)B, sizeof(*lens));
  mbd_mamba1_state **st = calloc((size_t)B, sizeof(*st)); /* NULL entries are fine for destroy */
  if (!tp || !lens || !st) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld states", (long long)B);
    goto fail;
  }
  for (int64_t b = 0; b < B; b++) {
    tp[b] = ids + b * T;
    lens[b] = T;
    if ((rc = mbd_mamba1_state_new(m, &st[b], err))) goto fail;
  }
  double t0 = now_s();
  if ((rc = mbd_mamba1_prefill(m, st, (int)B, tp, lens, MBD_MAMBA1_LOGITS_ALL, logits, err)))
    goto fail;
  *t_prefill = now_s() - t0;
  if (gp->n_new > 0) {
    gp->first_logits = logits + (T - 1) * V;
    gp->first_stride = T * V;
    t0 = now_s();
    if ((rc = mbd_mamba1_generate(m, st, (int)B, tp, lens, gp, gen, NULL, err))) goto fail;
    *t_gen = now_s() - t0;
  }
fail:
  if (st)
    for (int64_t b = 0; b < B; b++) mbd_mamba1_state_destroy(&st[b]);
  free(st);
  free(lens);
  free(tp);
  return rc;
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *in_path = NULL, *out_path = NULL, *backend = "cpu";
  const char *dts = "f32", *isas = "auto", *modes = NULL;
  long long threads = 0, n_gen = 0, top_k = 0, seed = 0;
  float temperature = 0.0f, top_p = 1.0f;
  int32_t stop[MAX_STOP];
  int nstop = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0, takes = 1;
    long long tmp;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--model")) model_dir = v;
    else if (!strcmp(a, "--input")) in_path = v;
    else if (!strcmp(a, "--output")) out_path = v;
    else if (!strcmp(a, "--backend")) backend = v;
    else if (!strcmp(a, "--dtype")) dts = v;
    else if (!strcmp(a, "--gemm-mode")) modes = v;
    else if (!strcmp(a, "--isa")) isas = v;
    else if (!strcmp(a, "--threads")) bad = parse_ll(a, v, 0, 256, &threads);
    else if (!strcmp(a, "--generate")) bad = parse_ll(a, v, 0, 1 << 20, &n_gen);
    else if (!strcmp(a, "--top-k")) bad = parse_ll(a, v, 0, 1 << 30, &top_k);
    else if (!strcmp(a, "--seed")) bad = parse_ll(a, v, 0, INT64_MAX, &seed);
    else if (!strcmp(a, "--temperature")) bad = parse_f(a, v, &temperature);
    else if (!strcmp(a, "--top-p")) bad = parse_f(a, v, &top_p);
    else if (!strcmp(a, "--stop")) {
      bad = parse_ll(a, v, 0, INT32_MAX, &tmp);
      if (!bad && nstop == MAX_STOP) {
        fprintf(stderr, "mambad-run: at most %d --stop tokens\n", MAX_STOP);
        bad = 1;
      }
      if (!bad) stop[nstop++] = (int32_t)tmp;
    } else {
      fprintf(stderr, "mambad-run: unknown argument '%s' (see --help)\n", a);
      return 2;
    }
    if (takes && !v && !bad) {
      fprintf(stderr, "mambad-run: %s needs a value\n", a);
      return 2;
    }
    if (bad) return 2;
    i += takes;
  }
  if (!model_dir || !in_path || !out_path) {
    fprintf(stderr, "mambad-run: --model, --input and --output are required (see --help)\n");
    return 2;
  }
  mbd_error err = {0};
  mbd_backend_kind kind = MBD_BACKEND_CPU;
  mbd_dtype_policy policy = MBD_POLICY_F32;
  mbd_gemm_mode mode = MBD_GEMM_DETERMINISTIC;
  int device = 0;
  if (parse_backend(backend, &kind, &device)) return 2;
  if (mbd_dtype_policy_parse(dts, &policy, &err)) {
    fprintf(stderr, "mambad-run: --dtype: %s\n", err.msg);
    return 2;
  }
  if (mbd_gemm_mode_resolve(modes, &mode, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    return 2;
  }
  mbd_mamba1_options opts;
  mbd_mamba1_options_default(&opts);
  if (kind == MBD_BACKEND_CUDA) {
#ifndef MBD_HAVE_CUDA
    fprintf(stderr, "mambad-run: this build has no CUDA backend (it was configured without the "
                    "CUDA toolkit; rebuild with -DMBD_CUDA=ON where nvcc exists) - use --backend "
                    "cpu\n");
    return 2;
#endif
  } else {
    if (mode != MBD_GEMM_DETERMINISTIC) {
      fprintf(stderr, "mambad-run: --gemm-mode %s needs --backend cuda: the cpu backend runs "
                      "only deterministic (valid: deterministic, cublas-fast, cublas-pedantic)\n",
              mbd_gemm_mode_name(mode));
      return 2;
    }
    if (policy == MBD_POLICY_TF32) {
      fprintf(stderr, "mambad-run: --dtype tf32 needs --backend cuda: the cpu backend runs f32, "
                      "bf16 or f16\n");
      return 2;
    }
    opts.dtype = policy == MBD_POLICY_BF16  ? MBD_DTYPE_BF16
                 : policy == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                            : MBD_DTYPE_F32;
  }
  if (!strcmp(isas, "auto")) opts.isa = MBD_CPU_ISA_AUTO;
  else if (!strcmp(isas, "portable")) opts.isa = MBD_CPU_ISA_PORTABLE;
  else if (!strcmp(isas, "avx2")) opts.isa = MBD_CPU_ISA_AVX2;
  else {
    fprintf(stderr, "mambad-run: --isa must be auto, portable or avx2 (got '%s')\n", isas);
    return 2;
  }
  opts.threads = (int)threads;
  mbd_generate_params gp = {.n_new = n_gen, .stop = stop, .nstop = nstop};
  gp.sampling.temperature = temperature;
  gp.sampling.top_k = (int)top_k;
  gp.sampling.top_p = top_p;
  gp.sampling.seed = (uint64_t)seed;
  if (mbd_sampling_check(&gp.sampling, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    return 2;
  }

  int rc = 1;
  mbd_safetensors *in = NULL;
  mbd_mamba1_model *m = NULL;
#ifdef MBD_HAVE_CUDA
  mbd_run_cuda *rcu = NULL;
#endif
  int32_t *ids = NULL, *gen = NULL;
  int64_t *tokens_out = NULL;
  float *logits = NULL;
  mbd_st_writer *w = NULL;
  int64_t B = 0, T = 0, V = 0;
  char label[192] = "";
#ifdef MBD_HAVE_CUDA
  char devs[16] = "";
#endif
  const mbd_st_entry *e = mbd_safetensors_open(in_path, &in, &err) ? NULL
                          : mbd_safetensors_find(in, "input_ids");
  if (!in) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    goto done;
  }
  if (!e || e->desc.dtype != MBD_DTYPE_I64 || e->desc.ndim != 2 || e->desc.shape[0] < 1 ||
      e->desc.shape[1] < 1) {
    char d[96] = "absent";
    if (e) mbd_tensor_desc_format(&e->desc, d, sizeof(d));
    fprintf(stderr, "mambad-run: %s: need input_ids i64[B,T] with B, T >= 1, found %s\n",
            in_path, d);
    goto done;
  }
  B = e->desc.shape[0];
  T = e->desc.shape[1];
  if (B > 1 << 16 || T > 1 << 28) {
    fprintf(stderr, "mambad-run: input_ids [%lld, %lld] too large (max batch 65536, max length "
                    "2^28)\n", (long long)B, (long long)T);
    goto done;
  }
  double t0 = now_s();
  if (kind == MBD_BACKEND_CPU) {
    if (mbd_mamba1_load(model_dir, &opts, &m, &err)) {
      fprintf(stderr, "mambad-run: %s\n", err.msg);
      goto done;
    }
    V = mbd_mamba1_vocab(m);
    snprintf(label, sizeof label, "cpu %s %s", mbd_dtype_policy_name(policy), mbd_mamba1_isa(m));
  }
#ifdef MBD_HAVE_CUDA
  else {
    mbd_run_cuda_opts co = {.device = device, .mode = mode, .policy = policy};
    if (mbd_run_cuda_new(model_dir, &co, &rcu, &err)) {
      fprintf(stderr, "mambad-run: %s\n", err.msg); /* err names cuda:N */
      goto done;
    }
    V = mbd_run_cuda_vocab(rcu);
    snprintf(devs, sizeof devs, "cuda:%d", device);
    snprintf(label, sizeof label, "%s (%s) %s %s, route %.12s", devs,
             mbd_run_cuda_device_name(rcu), mbd_dtype_policy_name(policy),
             mbd_gemm_mode_name(mode), mbd_run_cuda_route_id(rcu));
  }
#endif
  double t_load = now_s() - t0;
  ids = malloc((size_t)(B * T) * sizeof(int32_t));
  logits = malloc((size_t)B * (size_t)T * (size_t)V * sizeof(float));
  if (!ids || !logits) {
    fprintf(stderr, "mambad-run: out of memory for batch %lld x %lld x vocab %lld logits\n",
            (long long)B, (long long)T, (long long)V);
    goto done;
  }
  for (int64_t i = 0; i < B * T; i++) {
    int64_t v;
    memcpy(&v, (const char *)e->data + 8 * i, 8);
    if (v < 0 || v >= V) {
      fprintf(stderr, "mambad-run: input_ids[%lld][%lld] = %lld is outside the vocabulary [0, %lld)\n",
              (long long)(i / T), (long long)(i % T), (long long)v, (long long)V);
      goto done;
    }
    ids[i] = (int32_t)v;
  }
  if (n_gen > 0) {
    gen = malloc((size_t)(B * n_gen) * sizeof(int32_t));
    tokens_out = malloc((size_t)(B * (T + n_gen)) * sizeof(int64_t));
    if (!gen || !tokens_out) {
      fprintf(stderr, "mambad-run: out of memory for generated tokens\n");
      goto done;
    }
  }
  double t_prefill = 0, t_gen = 0;
  int run_rc;
  if (kind == MBD_BACKEND_CPU) {
    run_rc = run_cpu(m, B, T, ids, &gp, logits, gen, &t_prefill, &t_gen, &err);
  } else {
#ifdef MBD_HAVE_CUDA
    mbd_run_cuda_gen cg = {.n_new = n_gen, .sampling = gp.sampling, .stop = stop, .nstop = nstop};
    run_rc = mbd_run_cuda_run(rcu, B, T, ids, &cg, logits, gen, &t_prefill, &t_gen, &err);
#else
    run_rc = mbd_error_set(&err, MBD_E_INTERNAL, "no CUDA backend in this build");
#endif
  }
  if (run_rc) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    goto done;
  }
  for (int64_t b = 0; b < B && n_gen > 0; b++) {
    for (int64_t t = 0; t < T; t++) tokens_out[b * (T + n_gen) + t] = ids[b * T + t];
    for (int64_t g = 0; g < n_gen; g++) tokens_out[b * (T + n_gen) + T + g] = gen[b * n_gen + g];
  }
  mbd_tensor_desc dl, dt;
  int64_t sl[3] = {B, T, V}, stok[2] = {B, T + n_gen};
  int werr = mbd_tensor_desc_make(&dl, MBD_DTYPE_F32, 3, sl, &err) || mbd_st_writer_new(&w, &err) ||
             mbd_st_writer_add(w, "logits", &dl, logits, &err) ||
             (n_gen > 0 && (mbd_tensor_desc_make(&dt, MBD_DTYPE_I64, 2, stok, &err) ||
                            mbd_st_writer_add(w, "tokens", &dt, tokens_out, &err))) ||
             mbd_st_writer_set_metadata(w, "backend", mbd_backend_name(kind), &err) ||
             mbd_st_writer_set_metadata(w, "dtype", mbd_dtype_policy_name(policy), &err) ||
             mbd_st_writer_set_metadata(w, "gemm_mode", mbd_gemm_mode_name(mode), &err);
  if (!werr && kind == MBD_BACKEND_CPU)
    werr = mbd_st_writer_set_metadata(w, "isa", mbd_mamba1_isa(m), &err);
#ifdef MBD_HAVE_CUDA
  if (!werr && kind == MBD_BACKEND_CUDA)
    werr = mbd_st_writer_set_metadata(w, "route_id", mbd_run_cuda_route_id(rcu), &err) ||
           mbd_st_writer_set_metadata(w, "device", devs, &err) ||
           mbd_st_writer_set_metadata(w, "device_name", mbd_run_cuda_device_name(rcu), &err);
#endif
  if (werr || mbd_st_writer_write(w, out_path, &err)) {
    fprintf(stderr, "mambad-run: writing %s: %s\n", out_path, err.msg);
    goto done;
  }
  fprintf(stderr, "mambad-run: %s: load %.2fs, prefill %lldx%lld in %.3fs (%.1f tok/s)%s", label,
          t_load, (long long)B, (long long)T, t_prefill,
          (double)(B * T) / (t_prefill > 0 ? t_prefill : 1e-9), n_gen > 0 ? "" : "\n");
  if (n_gen > 0)
    fprintf(stderr, ", generated %lldx%lld in %.3fs (%.1f tok/s)\n", (long long)B,
            (long long)n_gen, t_gen, (double)(B * n_gen) / (t_gen > 0 ? t_gen : 1e-9));
  rc = 0;
done:
  mbd_st_writer_destroy(&w);
  free(logits);
  free(tokens_out);
  free(gen);
  free(ids);
#ifdef MBD_HAVE_CUDA
  mbd_run_cuda_destroy(&rcu);
#endif
  mbd_mamba1_destroy(&m);
  mbd_safetensors_destroy(&in);
  return rc;
}
