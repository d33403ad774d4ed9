/* The causal depthwise conv over a chunk's rows (see conv_rows.h). */
#include "kernels/model/conv_rows.h"

#include "kernels/cpu/mamba_ops.h"

#define CHANNEL_BLOCK 64 /* channels per task */

typedef struct job {
  const mbd_conv_rows *c;
  int64_t nblocks; /* channel blocks per segment */
} job;

static void conv_task(void *arg, int64_t task, int thread) {
  (void)thread;
  const job *j = arg;
  const mbd_conv_rows *c = j->c;
  const int64_t *sg = c->seg + 4 * (task / j->nblocks);
  int64_t c0 = (task % j->nblocks) * CHANNEL_BLOCK;
  int64_t c1 = c0 + CHANNEL_BLOCK < c->channels ? c0 + CHANNEL_BLOCK : c->channels;
  float *window = c->states[sg[0]]->buf + c->state_off;
  mbd_cpu_isa isa = mbd_cpu_ctx_isa(c->ctx);
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++)
    mbd_cpu_conv_step(isa, c0, c1, c->channels, c->dc, c->w, c->b, window, c->in + r * c->ld_in,
                      c->out + r * c->channels);
}

void mbd_conv_rows_run(const mbd_conv_rows *c, int64_t rows) {
  job j = {.c = c, .nblocks = (c->channels + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK};
  mbd_cpu_ctx_run_sized(c->ctx, conv_task, &j, c->nseg * j.nblocks, rows * c->channels * c->dc);
}
