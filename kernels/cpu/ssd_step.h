/* One time step of the Mamba-2 state-space recurrence (the SSD layer in its
 * recurrent form) on the CPU, f32. Prefill and decode both call this once per
 * token in time order, so a prefill of T tokens, in any chunking, and T
 * single-token steps make the same roundings (docs/route.md, "Mamba-2").
 * Single-threaded over the given head range; callers parallelise across
 * heads and sequences, which never changes the bits. */
#ifndef MBD_CPU_SSD_STEP_H
#define MBD_CPU_SSD_STEP_H

#include <stdint.h>

#include "kernels/cpu/cpu_ctx.h"

/* The step size of head h: dt = softplus(dt_raw + dt_bias) (one f32 add,
 * then mbd_pm_softplus), then clamped to [lo, hi] (lo = 0, hi = +inf clamp
 * nothing). */
float mbd_cpu_ssd_dt(float dt_raw, float dt_bias, float lo, float hi);

/* Shapes of one Mamba-2 layer's recurrence. */
typedef struct mbd_ssd_dims {
  int heads;    /* H */
  int head_dim; /* P: channels per head */
  int d_state;  /* N */
  int n_groups; /* G: B and C are shared by H / G consecutive heads */
} mbd_ssd_dims;

/* For heads h in [h0, h1), with g = h / (H / G), channel c = h P + p:
 *   dt = mbd_cpu_ssd_dt(dt_raw[h], dt_bias[h], lo, hi)
 *   dA = mbd_pm_expf(dt * A[h])
 *   for n ascending:
 *     s[c][n] = fmaf(dA, s[c][n], (dt * B[g N + n]) * x[c])
 *     y = fmaf(s[c][n], C[g N + n], y)            (y starts at +0)
 *   y[c] = fmaf(D[h], x[c], y)
 * A = -exp(A_log) per head, state s is [H P][N], x and y are [H P], B and C
 * [G N]. y is not gated here (see gated_rmsnorm.h). */
void mbd_cpu_ssd_step(mbd_cpu_isa isa, const mbd_ssd_dims *dm, int h0, int h1, const float *A,
                      const float *D, const float *dt_bias, float lo, float hi,
                      const float *dt_raw, const float *B, const float *C, const float *x,
                      float *state, float *y);

#endif
