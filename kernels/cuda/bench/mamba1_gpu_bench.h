/* Bench-only support for the Mamba-1 GPU model (library mbd_cuda_bench, which
 * only tests and benchmarks link): a model with synthetic random weights, and
 * the probes a benchmark attaches through mbd_mamba1_gpu_options (stage
 * events of a decode step, the persistent decode's stage trace) with their
 * printers. C header: no CUDA types. */
#ifndef MBD_MAMBA1_GPU_BENCH_H
#define MBD_MAMBA1_GPU_BENCH_H

#include <stdint.h>

#include "common/mamba_config.h"
#include "common/status.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/mamba1_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model of config cfg with synthetic random weights generated on the device
 * from seed: uniform +-1/sqrt(fan_in) matrices, A_log = log(1..N), D = 1,
 * norms 1, dt bias giving dt in about [0.001, 0.1]. Options and ownership as
 * mbd_mamba1_gpu_load; destroy with mbd_mamba1_gpu_destroy. */
int mbd_mamba1_gpu_new_random(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg, uint64_t seed,
                              const mbd_mamba1_gpu_options *opts, mbd_mamba1_gpu **out,
                              mbd_error *err);

/* Probes for one model on the current device; must outlive the model. */
typedef struct mbd_m1g_probes mbd_m1g_probes;

/* step_events: creates the six decode-step stage events; dp_trace: allocates
 * a persistent-decode trace buffer for n_layer layers (zeroed). Call outside
 * any stream capture, before the model is created. */
int mbd_m1g_probes_new(int n_layer, int step_events, int dp_trace, mbd_m1g_probes **out,
                       mbd_error *err);
/* Points o's step_events and dp_trace at the probes (those asked for). */
void mbd_m1g_probes_attach(const mbd_m1g_probes *p, mbd_mamba1_gpu_options *o);
/* Prints the device time between the stage events of the last decode step
 * that recorded them (nothing without step events; a line saying so when no
 * step recorded them). */
void mbd_m1g_probes_print_step(const mbd_m1g_probes *p);
/* Prints the persistent decode's time per stage of its last launch: mean
 * over the blocks that took part and the slowest block, us per layer over
 * layers 1..n_layer-2, and block 0's whole launch (nothing without a trace or
 * with fewer than 3 layers; a line saying so when no launch filled it). */
void mbd_m1g_probes_print_trace(const mbd_m1g_probes *p);
/* NULL-safe; nulls *p. After the model that used them. */
void mbd_m1g_probes_destroy(mbd_m1g_probes **p);

#ifdef __cplusplus
}
#endif
#endif
