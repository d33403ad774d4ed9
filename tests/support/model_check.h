/* Checks that the CPU model tests of every family make: errors of logits
 * against a reference, and runs through the family's vtable
 * (kernels/model/family.h, whose entries are the typed API's functions
 * cast) compared bit for bit: a sequence alone, prefill then decode, the
 * fixture's prompts as one batch, sequences in any slot of a batch. Each
 * check fails the running cmocka test saying what differs. */
#ifndef MBD_TESTS_SUPPORT_MODEL_CHECK_H
#define MBD_TESTS_SUPPORT_MODEL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/model/family.h"

/* The largest |x[i]| over n values. */
double mc_max_abs(const float *x, size_t n);
/* The largest |a[i] - b[i]| over n values. */
double mc_max_err(const float *a, const float *b, size_t n);
/* One position's relative error: max |got - ref| / max |ref| over V logits. */
double mc_rel_err(const float *got, const float *ref, int V);
/* The first index of the largest of x[0 .. V). */
int mc_argmax(const float *x, int V);
/* Each of npos positions of V logits within relative error tol of ref;
 * fails naming the first that is not ("<what> position p"). Returns the
 * worst error. */
double mc_check_positions(const float *got, const float *ref, int npos, int V, double tol,
                          const char *what);

/* A fresh state of model m. Free it with ops->state_free. */
void *mc_state_new(const mbd_cpu_model_ops *ops, const void *m);
/* The state's image; *n gets its size; the caller frees it. */
uint8_t *mc_state_image(const mbd_cpu_model_ops *ops, const void *s, size_t *n);
/* The state's image is want (want_len bytes), by length and memcmp. */
void mc_check_state(const mbd_cpu_model_ops *ops, const void *s, const uint8_t *want,
                    size_t want_len, const char *what);

/* One sequence of len tokens from a fresh state, as one prefill (run_alone)
 * or one step a token (run_steps): logits [len, V]; with img, its final
 * state image (*img, *n, as mc_state_image). */
void mc_run_alone(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                  float *logits, uint8_t **img, size_t *n);
void mc_run_steps(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                  float *logits, uint8_t **img, size_t *n);
/* mc_run_alone's logits equal want [len, V] and, with want_state, its state
 * image equals want_state (want_len bytes), by memcmp. */
void mc_check_alone(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok, int64_t len,
                    const float *want, const uint8_t *want_state, size_t want_len,
                    const char *what);
/* From a fresh state: the first k tokens in prefills of `chunk` tokens
 * (chunk <= 0: one prefill), then one step a token to len; logits [len, V].
 * Returns the state (free it with ops->state_free). */
void *mc_prefill_then_steps(const mbd_cpu_model_ops *ops, void *m, const int32_t *tok,
                            int64_t k, int64_t len, int64_t chunk, float *logits);

/* The B prompts ids [B, T] fed to states[0 .. B) as one batch, by one
 * prefill (prefill_prompts) or one batched step a position
 * (decode_prompts): logits [B, T, V] either way. */
void mc_prefill_prompts(const mbd_cpu_model_ops *ops, void *m, void *const *states, int B,
                        const int32_t *ids, int T, float *logits);
void mc_decode_prompts(const mbd_cpu_model_ops *ops, void *m, void *const *states, int B,
                       const int32_t *ids, int T, float *logits);

/* One sequence of a batch and what it gives alone. */
typedef struct mc_seq {
  const int32_t *tok;       /* its tokens */
  int64_t len;              /* how many */
  const float *logits;      /* [len, V] alone; NULL: a filler, nothing of it compared */
  const uint8_t *state;     /* its final state image alone, or NULL: not compared */
  size_t state_len;         /* its size */
  int32_t next;             /* with a step: the token then fed */
  const float *next_logits; /* with a step: [V] that step's logits alone */
} mc_seq;

/* The n sequences prefilled as one batch from fresh states, then (step != 0)
 * one batched step of their next tokens: each compared sequence's logit
 * rows, step row and final state equal its alone ones, by memcmp; a
 * failure names "<what> slot i of n". */
void mc_check_batch(const mbd_cpu_model_ops *ops, void *m, const mc_seq *seqs, int n, int step,
                    const char *what);

#endif
