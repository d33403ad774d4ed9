/* Decode-step stage events and the persistent decode's stage trace for
 * benchmarks (see mamba1_gpu_bench.h; the layouts are mamba1_gpu.h's
 * step_events and decode_persistent.h's trace). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/gpu_check.h"
extern "C" {
#include "kernels/cuda/bench/mamba1_gpu_bench.h"
#include "kernels/cuda/decode_persistent.h"
}

struct mbd_m1g_probes {
  int n_layer;
  int nev;                                    /* 0 or MBD_MAMBA1_GPU_STEP_EVENTS */
  cudaEvent_t ev[MBD_MAMBA1_GPU_STEP_EVENTS];
  long long *trace;                           /* device, trace_bytes, or NULL */
  size_t trace_bytes;
};

extern "C" int mbd_m1g_probes_new(int n_layer, int step_events, int dp_trace,
                                  mbd_m1g_probes **out, mbd_error *err) {
  int rc = 0;
  *out = NULL;
  mbd_m1g_probes *p = (mbd_m1g_probes *)calloc(1, sizeof *p);
  if (!p) return mbd_error_set(err, MBD_E_NOMEM, "probes: out of host memory");
  p->n_layer = n_layer;
  for (int i = 0; step_events && i < MBD_MAMBA1_GPU_STEP_EVENTS; i++) {
    MBD_GPU_TRY(cudaEventCreate(&p->ev[i]), err);
    p->nev = i + 1;
  }
  if (dp_trace) {
    p->trace_bytes = mbd_dp_trace_bytes(n_layer);
    if (!p->trace_bytes) {
      rc = mbd_error_set(err, MBD_E_DEVICE, "probes: no trace size for %d layers here", n_layer);
      goto fail;
    }
    MBD_GPU_TRY(cudaMalloc((void **)&p->trace, p->trace_bytes), err);
    MBD_GPU_TRY(cudaMemset(p->trace, 0, p->trace_bytes), err);
  }
  *out = p;
  return 0;
fail:
  mbd_m1g_probes_destroy(&p);
  return rc;
}

extern "C" void mbd_m1g_probes_attach(const mbd_m1g_probes *p, mbd_mamba1_gpu_options *o) {
  if (p->nev == MBD_MAMBA1_GPU_STEP_EVENTS)
    for (int i = 0; i < MBD_MAMBA1_GPU_STEP_EVENTS; i++) o->step_events[i] = (void *)p->ev[i];
  if (p->trace) o->dp_trace = p->trace;
}

extern "C" void mbd_m1g_probes_print_step(const mbd_m1g_probes *p) {
  static const char *name[MBD_MAMBA1_GPU_STEP_EVENTS - 1] = {
      "inputs up (copy)", "layers", "final add + norm", "lm_head", "sampling"};
  const int last = MBD_MAMBA1_GPU_STEP_EVENTS - 1;
  if (p->nev != MBD_MAMBA1_GPU_STEP_EVENTS) return;
  float ms[MBD_MAMBA1_GPU_STEP_EVENTS] = {0}; /* [i]: event i to i + 1; [last]: the total */
  bool ok = cudaEventSynchronize(p->ev[last]) == cudaSuccess;
  for (int i = 0; ok && i < last; i++)
    ok = cudaEventElapsedTime(&ms[i], p->ev[i], p->ev[i + 1]) == cudaSuccess;
  if (ok) ok = cudaEventElapsedTime(&ms[last], p->ev[0], p->ev[last]) == cudaSuccess;
  if (!ok) { /* never recorded: no persistent step since the probes were made */
    (void)cudaGetLastError();
    printf("decode step events: none recorded\n");
    return;
  }
  printf("decode step on the device (events in the graph), us:");
  for (int i = 0; i < last; i++) printf(" %s %.1f;", name[i], ms[i] * 1e3);
  printf(" total %.1f\n", ms[last] * 1e3);
}

extern "C" void mbd_m1g_probes_print_trace(const mbd_m1g_probes *p) {
  enum { TP = MBD_DP_TRACE_POINTS };
  const int L = p->n_layer;
  if (!p->trace || L < 3) return; /* the mean skips the first and the last layer */
  const int nb = (int)((p->trace_bytes / 8 - 2) / ((size_t)L * TP));
  long long *t = (long long *)malloc(p->trace_bytes);
  int khz = 0, dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
  if (!t || khz <= 0 || cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(t, p->trace, p->trace_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    (void)cudaGetLastError();
    free(t);
    return;
  }
  /* segments: [from point, to point], the last one into the next layer's 0 */
  static const char *name[TP] = {"A: wait out+norm", "A: in_proj mma", "A: fold+conv",
                                 "A: x_proj parts",  "C: wait+fold",   "C: scan",
                                 "D: wait y",        "D: out_proj",    "layer end"};
  int np = 0; /* blocks that took part (the others left zero stamps) */
  for (int b = 0; b < nb; b++) np += t[(size_t)b * L * TP + TP] != 0;
  if (np == 0) { /* no persistent launch since the probes were made */
    printf("persistent decode trace: no launch recorded\n");
    free(t);
    return;
  }
  printf("persistent decode trace, %d of %d blocks, us per layer (layers 1..%d): "
         "mean over blocks / max\n", np, nb, L - 2);
  double tot_mean = 0;
  for (int sgm = 0; sgm < TP; sgm++) {
    double mean = 0, mx = 0;
    for (int l = 1; l + 1 < L; l++) {
      double lm = 0, lx = 0;
      for (int b = 0; b < nb; b++) {
        const long long *r = t + ((size_t)b * L + l) * TP;
        if (r[0] == 0) continue;
        const long long a = r[sgm], z = sgm == TP - 1 ? r[TP] : r[sgm + 1];
        const double us = (double)(z - a) / (double)khz * 1e3;
        lm += us / np;
        lx = us > lx ? us : lx;
      }
      mean += lm / (L - 2);
      mx += lx / (L - 2);
    }
    tot_mean += mean;
    printf("  %-16s %7.2f %7.2f\n", name[sgm], mean, mx);
  }
  printf("  %-16s %7.2f\n", "layer", tot_mean);
  const long long *gt = t + (size_t)nb * L * TP;
  printf("  whole launch (block 0, globaltimer): %.1f us\n", (double)(gt[1] - gt[0]) * 1e-3);
  free(t);
}

extern "C" void mbd_m1g_probes_destroy(mbd_m1g_probes **pp) {
  if (!pp || !*pp) return;
  mbd_m1g_probes *p = *pp;
  for (int i = 0; i < p->nev; i++) cudaEventDestroy(p->ev[i]);
  cudaFree(p->trace);
  free(p);
  *pp = NULL;
}
