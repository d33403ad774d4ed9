/* Synthetic Mamba-1 checkpoints: seeded random weights in the exact Hugging
 * Face layout (config.json + model.safetensors), initialised like
 * MambaForCausalLM so the model is numerically sane (A_log = log(1..S),
 * D = 1, dt bias = softplus^-1 of dt log-uniform in [1e-3, 1e-1], uniform
 * fan-in projections, unit norms). For benchmarks and tests without downloads. */
#ifndef MBD_SYNTH_H
#define MBD_SYNTH_H

#include <stdint.h>

#include "common/mamba_config.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"

/* Fills cfg for a named shape: "130m" (d768 L24), "370m" (d1024 L48),
 * "1.4b" (d2048 L48), "2.8b" (d2560 L64); vocab 50280, d_state 16, d_conv 4,
 * expand 2, dt_rank ceil(d/16). MBD_E_INVALID names the valid shapes. */
int mbd_synth_shape(const char *name, mbd_mamba_config *cfg, mbd_error *err);
/* Fills cfg for custom sizes with the same defaults. */
void mbd_synth_custom(int d_model, int n_layer, int vocab, mbd_mamba_config *cfg);

/* Writes dir/config.json and dir/model.safetensors (dir must exist) with
 * tensors stored in dtype (f32, bf16, f16). Holds all weights in memory while
 * writing. */
int mbd_synth_write(const mbd_mamba_config *cfg, mbd_dtype dtype, uint64_t seed, const char *dir,
                    mbd_error *err);
/* The same, reporting progress through `progress` (NULL: silent): tensors
 * generated ("synthesising DIR") and then written ("writing DIR/..."), each
 * against the checkpoint's size, so small checkpoints stay quiet. */
int mbd_synth_write_progress(const mbd_mamba_config *cfg, mbd_dtype dtype, uint64_t seed,
                             const char *dir, const mbd_progress_opts *progress, mbd_error *err);

#endif
