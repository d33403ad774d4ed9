/* A fake compute backend for the worker's unit tests: an mbd_backend_ops
 * implementation with no arithmetic. A state is the hash of every token it
 * consumed and its logits depend on that hash only (a unique argmax at
 * h % V), so a row's answer is a function of its own session's history,
 * never of its batch neighbours; every batched step call is logged. */
#ifndef MBD_TEST_FAKE_BACKEND_H
#define MBD_TEST_FAKE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define FB_LOG_MAX 64  /* step calls recorded */
#define FB_ROWS_MAX 16 /* rows recorded per call */

/* One session's state; state_save writes this struct as it is. */
typedef struct fb_state {
  uint64_t h; /* hash of the tokens consumed */
  int64_t n;  /* tokens consumed */
  int id;     /* 0, 1, 2... in state_new order: names the session in the step log */
} fb_state;

typedef struct fb_call {
  int model;                   /* vocab of the model stepped */
  int64_t n;                   /* rows */
  int ids[FB_ROWS_MAX];        /* fb_state.id of each row */
  int64_t tokens[FB_ROWS_MAX]; /* token of each row */
  bool logits;                 /* logits were asked for */
  bool greedy;                 /* through step_greedy */
} fb_call;

/* The backend's private data (mbd_backend.impl). */
typedef struct fb_backend {
  int next_id;     /* id of the next state */
  int fail_call;   /* 1-based step call that fails with MBD_E_DEVICE; 0 = none */
  fb_call log[FB_LOG_MAX];
  int ncalls;      /* step calls so far */
  int live_states; /* state_new minus state_free */
} fb_backend;

/* route, models, states and step (logits on the host, greedy picks by the
 * worker). Tests that need more copy it and add fb_step_greedy (greedy picks
 * "on the device") or fb_state_bytes / fb_state_save (checkpoints). */
extern const mbd_backend_ops fb_ops;

/* Next hash after consuming tok. */
uint64_t fb_mix(uint64_t h, int64_t tok);

/* Logits [V] of a state with hash h: 0 at h % V, negative elsewhere. */
void fb_logits(uint64_t h, int64_t V, float *out);

/* A backend with ops (fb_ops or a copy) and a zeroed fb_backend, which
 * *impl borrows (the backend's destroy frees both). */
mbd_backend *fb_backend_new(const mbd_backend_ops *ops, fb_backend **impl);

/* A model of the given vocabulary (taken by mbd_wstate_add_model). */
mbd_bmodel *fb_model_new(int64_t vocab);

/* The optional ops. */
int fb_step_greedy(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                   const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                   mbd_error *err);
size_t fb_state_bytes(const mbd_bstate *s);
int fb_state_save(const mbd_bstate *s, void *dst, size_t cap, mbd_error *err);

#endif
