/* The gated RMSNorm of a Mamba-2 mixer (mamba_ssm's RMSNormGated), f32, one
 * token row. Row-wise: a row's bits depend on that row only. */
#ifndef MBD_CPU_GATED_RMSNORM_H
#define MBD_CPU_GATED_RMSNORM_H

#include <stdbool.h>
#include <stdint.h>

/* Over n channels in groups of `group` (n a multiple of group; group = n is
 * one norm over the whole row), with r = 1 / sqrtf(ss / group + eps) and ss
 * the fmaf chain of v^2 in ascending channel order within the group:
 *   gate first (norm_before_gate false, Hugging Face and mamba_ssm default):
 *     v = y * silu(z);  out = w * (v * r)
 *   norm first: v = y;  out = (w * (v * r)) * silu(z)
 * silu is mbd_pm_silu. out may equal y. */
void mbd_cpu_gated_rmsnorm(const float *y, const float *z, const float *w, int64_t n,
                           int64_t group, float eps, bool norm_before_gate, float *out);

#endif
