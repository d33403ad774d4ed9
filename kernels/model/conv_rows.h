/* The causal depthwise conv of Mamba-1 and Mamba-2 over a chunk's rows:
 * each sequence's rows in time order through mbd_cpu_conv_step
 * (kernels/cpu/mamba_ops.h), its window in the sequence's state, parallel
 * over blocks of channels. A channel's bits depend only on its own inputs,
 * so neither the blocks nor the batch change them. */
#ifndef MBD_KERNELS_MODEL_CONV_ROWS_H
#define MBD_KERNELS_MODEL_CONV_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/seq_state.h"

/* One layer's conv over a chunk (the segments of kernels/model/rows.h). */
typedef struct mbd_conv_rows {
  mbd_cpu_ctx *ctx;              /* threads and ISA */
  mbd_seq_state *const *states;  /* the chunk's states, by segment seq */
  const int64_t *seg;            /* nseg x {seq, row0, nrows, t0} */
  int64_t nseg;
  int64_t channels;              /* conv channels */
  int dc;                        /* taps */
  const float *w;                /* [dc][channels], tap-major */
  const float *b;                /* [channels] or NULL */
  size_t state_off;              /* the layer's window [dc-1][channels] in a state's buffer */
  const float *in;               /* row r's input: in + r * ld_in, [channels] */
  int64_t ld_in;
  float *out;                    /* row r's output, silu(conv): out + r * channels */
} mbd_conv_rows;

/* Runs the conv over the chunk's `rows` rows, advancing the windows. */
void mbd_conv_rows_run(const mbd_conv_rows *c, int64_t rows);

#endif
