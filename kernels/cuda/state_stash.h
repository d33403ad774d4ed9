/* State stashes: a copy of one slot's state in a device buffer of its own, so
 * the worker's prefix cache keeps states where they live. Saving and loading
 * are device-to-device copies of the family's slot regions (gpu_family.h
 * slot_regions) on the context's stream, ordered with the model's compute;
 * exporting writes the state image (kernels/state_blob.h) the backend's
 * state_save would have written for the slot the stash was saved from.
 * C header: no CUDA types. */
#ifndef MBD_KERNELS_STATE_STASH_H
#define MBD_KERNELS_STATE_STASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_family.h"

typedef struct mbd_state_stash mbd_state_stash;

/* Device bytes one stash of model `model` (family f) takes; 0 when the family
 * reports no slot regions (no stashes for it). */
size_t mbd_state_stash_bytes(const mbd_gpu_model_ops *f, void *model);

/* A stash for states of `model` (family f) on ctx (both borrowed: they must
 * outlive it). scratch_slot: a slot export may overwrite (it loads the stash
 * there and reads the image back through the family's slot_read).
 * MBD_E_NOMEM when the device has no room; MBD_E_UNSUPPORTED when the family
 * has no slot regions. */
int mbd_state_stash_new(mbd_gpu_ctx *ctx, const mbd_gpu_model_ops *f, void *model,
                        int64_t scratch_slot, mbd_state_stash **out, mbd_error *err);
/* Frees the device buffer (cudaFree: waits for the device); NULL-safe; nulls *s. */
void mbd_state_stash_free(mbd_state_stash **s);

/* Copies slot `slot` of `model` (which consumed pos tokens) into s; queued on
 * the stream, no wait. MBD_E_INVALID when model is not s's. */
int mbd_state_stash_save(mbd_state_stash *s, const void *model, int64_t slot, int64_t pos,
                         mbd_error *err);
/* Copies s into slot `slot` of `model`; *pos = the tokens it had consumed.
 * Queued on the stream, no wait. */
int mbd_state_stash_load(const mbd_state_stash *s, const void *model, int64_t slot, int64_t *pos,
                         mbd_error *err);
/* Writes s's state image (header + payload, cap >= the image's bytes) into
 * host dst; waits for the copy. Overwrites the scratch slot. */
int mbd_state_stash_export(const mbd_state_stash *s, void *dst, size_t cap, mbd_error *err);

#endif
