/* Synthetic Mamba-3 SISO checkpoints: seeded random weights in mamba_ssm's
 * layout (config.json with ssm_cfg.layer "Mamba3" + model.safetensors, keys
 * as kernels/model/mamba3.h reads them), initialised like upstream's Mamba3
 * (unit norms and B/C biases, D = 1, dt bias = softplus^-1 of dt
 * log-uniform in [1e-3, 1e-1], uniform fan-in projections). For demos and
 * benchmarks without downloads; `mambad model synth --family mamba3`. */
#ifndef MBD_MAMBA3_SYNTH_H
#define MBD_MAMBA3_SYNTH_H

#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/model/mamba3.h"

/* Fills cfg for a named shape: "130m" (d768 L24) or "1.3b" (d2048 L48), the
 * Mamba-2 geometries with Mamba-3 mixers: vocab 50280 (padded to 8), d_state
 * 128, headdim 64, expand 2, rope_fraction 0.5, ngroups 1; or "custom". Then
 * d_model / n_layer / vocab override when > 0. MBD_E_INVALID names the
 * shapes. */
int mbd_mamba3_synth_shape(const char *name, int d_model, int n_layer, int vocab,
                           mbd_mamba3_config *cfg, mbd_error *err);

/* Writes dir/config.json and dir/model.safetensors (dir must exist), tensors
 * stored in dtype (f32, bf16, f16). */
int mbd_mamba3_synth_write(const mbd_mamba3_config *cfg, mbd_dtype dtype, uint64_t seed,
                           const char *dir, mbd_error *err);

#endif
