/* Per-token Mamba-3 SISO ops on the CPU (f32): the row-wise preprocessing of
 * one in_proj row and the recurrent step of one head. Prefill and decode call
 * exactly these, one time step at a time, so a prefill of T tokens and T
 * single-token steps perform the same roundings (bit-identical logits and
 * state). Single-threaded; callers parallelise over rows (preprocessing) and
 * over (sequence, head) (step), which never changes the bits. The transcendental
 * functions are kernels/portable_math.h and kernels/model/mamba3_math.h. */
#ifndef MBD_CPU_MAMBA3_OPS_H
#define MBD_CPU_MAMBA3_OPS_H

#include <stdint.h>

/* The shapes one layer's ops need. */
typedef struct mbd_m3_dims {
  int64_t d_inner; /* heads * headdim */
  int heads, headdim, d_state, ngroups, angles; /* angles = rotary pairs S */
  float a_floor;   /* the decay's bound: A <= -a_floor */
  float eps;       /* B/C RMSNorm epsilon */
} mbd_m3_dims;

/* Rewrites one in_proj row [z | x | B | C | dd_dt | dd_A | trap | angle] in
 * place, in this order:
 *   B[g], C[g] = mbd_cpu_rmsnorm(., B_norm / C_norm, d_state, eps) per group g;
 *   dd_dt[h] -> dt = softplus(dd_dt + dt_bias[h]);
 *   dd_A[h]  -> A dt, A = mbd_m3_decay(dd_A, a_floor) (A * dt, one rounding);
 *   trap[h]  -> sigmoid(trap);
 *   angle[s] -> tanh(angle) * pi (f32 pi). */
void mbd_cpu_m3_preprocess(const mbd_m3_dims *d, const float *dt_bias, const float *b_norm,
                           const float *c_norm, float *row);

/* One token of head h (row as mbd_cpu_m3_preprocess left it):
 *   angle state, s < S: a = fmaf(theta[s], dt, a); a = fmaf(-2pi, floorf(a / 2pi), a)
 *   q = C[g] + C_bias[h], k = B[g] + B_bias[h] (g = h / (heads / ngroups)); pairs
 *   (2i, 2i+1), i < S, rotated by a[i] (sincos of mbd_m3_sincos):
 *     v0' = fmaf(v0, c, -(v1 s)),  v1' = fmaf(v0, s, v1 c); the other pairs as is
 *   alpha = e^(A dt); beta = ((1 - trap) dt) alpha; gamma = trap dt
 *   per p: vb = beta v_state[p], vg = gamma x[p]; y = +0; for n ascending:
 *     h[p][n] = fmaf(alpha, h[p][n], fmaf(k_state[n], vb, vg k[n]))
 *     y = fmaf(h[p][n], q[n], y)
 *   y = fmaf(D[h], x[p], y); gated (z != NULL): y = y * silu(z[p])
 *   k_state = k (rotated), v_state = x.
 * ang [S], ssm [headdim][d_state], kst [d_state], vst [headdim] are this
 * head's state; y [headdim]; scratch [2 d_state]. */
void mbd_cpu_m3_head_step(const mbd_m3_dims *d, int h, const float *row, const float *b_bias,
                          const float *c_bias, float D, int gated, float *ang, float *ssm,
                          float *kst, float *vst, float *y, float *scratch);

#endif
