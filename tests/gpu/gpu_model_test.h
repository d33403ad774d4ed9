/* For the GPU model tests (test_mamba1_state_bf16.c, test_mamba2_state_bf16.c,
 * test_mamba2_gpu.c, test_mamba3_gpu.c): the transformers fixtures, the
 * backends they run on, and the checks that more than one family makes
 * through the backend interface (chunked and long prefills against
 * decoding, batched steps against solo runs, the bf16 state's image and its
 * export / import, the route's state field, logits within a bound). Each
 * check fails the running cmocka test with what differs. */
#ifndef MBD_TESTS_GPU_MODEL_TEST_H
#define MBD_TESTS_GPU_MODEL_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "kernels/backend.h"

/* One fixture: MBD_FIXTURES_DIR/<family>/<name>/expected.safetensors. */
typedef struct gmt_fixture {
  char dir[1024];     /* the fixture's folder (config and checkpoint) */
  int64_t B, T, V, G; /* sequences, prompt tokens, vocabulary, greedy steps (0: none) */
  int64_t *ids;       /* [B, T] the prompts */
  int64_t *greedy;    /* [B, T + G] each prompt, then the reference's picks; or NULL */
  float *hf;          /* [B, T, V] the float64 reference's logits */
  float *lbf16;       /* [B, T, V] PyTorch's bf16 run's logits, or NULL */
  float *glogits;     /* [B, G, V] the reference's logits at the greedy steps, or NULL */
  float *target;      /* [B, T, V] logits_norm_per_group (Mamba-2 with n_groups > 1: the
                         per-group norm), else a copy of hf */
  int target_is_hf;   /* no per-group entry: target holds the logits */
} gmt_fixture;

/* Loads fixture `name` of `family` ("mamba1", "mamba2", "mamba3"); -1 when
 * MBD_FIXTURES_DIR is unset or the fixture is absent (the caller skips),
 * fails the test when its input_ids or logits are missing. */
int gmt_fixture_load(const char *family, const char *name, gmt_fixture *f);
void gmt_fixture_free(gmt_fixture *f);

/* A backend of `kind` in deterministic GEMM mode, 2 threads, 300 states,
 * batches up to 256; fails the test when it cannot be made. */
mbd_backend *gmt_backend(mbd_backend_kind kind, mbd_dtype_policy policy, mbd_state_dtype sd);

/* Removes the synthetic checkpoints written into dirs[0 .. n) (empty names
 * skipped): their config.json, model.safetensors and the folder. */
void gmt_remove_checkpoints(char (*dirs)[64], int n);

/* The image's SSM section (its last ssm_floats f32, after the header and
 * the f32 conv windows) holds bf16 values widened: the low 16 bits of every
 * f32 are zero, and some entry is not zero. */
void gmt_check_bf16_image(const uint8_t *img, size_t n, int64_t ssm_floats);

/* A CUDA backend with a bf16 state says state=bf16 in its route, and its
 * route id differs from the f32-state route's. */
void gmt_check_route_bf16(void);

/* Prefills of pre = 1, 1 + pre_step, ... <= T tokens of ids, in each of the
 * nchunks chunk lengths, then decoding to T: the logits [T, V] and the
 * state image equal those of decoding from the start (gd, gi of gn bytes),
 * by memcmp. */
void gmt_check_chunked_prefill(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int64_t T,
                               int64_t V, const int64_t *chunks, size_t nchunks,
                               int64_t pre_step, const float *gd, const uint8_t *gi, size_t gn,
                               const char *what);

/* B prompts of T tokens (ids from seed): the forward twice (run to run),
 * decoding the first prompt from the start against the forward's logits,
 * its state image's bf16 SSM section (ssm_floats), then the chunked
 * prefills of gmt_check_chunked_prefill; all by memcmp. */
void gmt_check_forward_decode_prefill(mbd_backend *gb, mbd_bmodel *gm, int64_t B, int64_t T,
                                      int seed, int64_t ssm_floats, const int64_t *chunks,
                                      size_t nchunks, int64_t pre_step, const char *what);

/* fw, the forward's logits [ns, tl, V] of the prompts ids [ns, tl], equals
 * decoding the ns sequences as one batch step by step, by memcmp. */
void gmt_check_batched_decode(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int ns,
                              int64_t tl, int64_t V, const float *fw, const char *what);

/* One sequence of tl tokens of ids prefilled in one call and, when piece > 0,
 * in pieces of `piece` tokens: logits and state image equal decoding it
 * token by token, by memcmp; with bf16_ssm > 0 the decoded image holds
 * bf16 values in its bf16_ssm SSM entries (gmt_check_bf16_image). */
void gmt_check_long_prefill(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int64_t tl,
                            int64_t V, int64_t piece, int64_t bf16_ssm);

/* The batch tests' sequences: GMT_NMAX sequences of `steps` tokens,
 * tok[i * steps + t]; their solo runs' logits [GMT_NMAX, steps, V]; and
 * batched steps of 2, 3, 7, 16, 33, 64, 129 and 256 of them (a different
 * mix for each size) whose every row equals its sequence's solo run, by
 * memcmp. The caller frees tok and solo. */
enum { GMT_NMAX = 256 };
int64_t *gmt_batch_tokens(int64_t V, int steps);
float *gmt_solo_runs(mbd_backend *gb, mbd_bmodel *gm, int64_t V, const int64_t *tok, int steps);
void gmt_check_batched_eq_solo(mbd_backend *gb, mbd_bmodel *gm, int64_t V, const int64_t *tok,
                               int steps, const float *solo, const char *what);
/* The three above in one: batched steps of the batch tests' sequences ==
 * their solo runs. */
void gmt_check_batch_invariance(mbd_backend *gb, mbd_bmodel *gm, int steps, const char *what);

/* On the bf16-state route, bf16 weights: the state exported after half a
 * prompt and imported into a fresh state of the same backend and of a second
 * one continues with the bits of decoding from the start (import then
 * export gives the same image); the device stash likewise, smaller than the
 * f32-state route's by 2 bytes an SSM entry (ssm_floats entries); an image
 * of the f32-state route imports, rounded to bf16, and a step runs on it. */
void gmt_check_export_import(const char *dir, int64_t ssm_floats);

/* The CPU backend refuses a bf16 state, and a CUDA backend with one the
 * Mamba-3 checkpoint in m3_dir, each saying where the bf16 state runs. */
void gmt_check_bf16_refusals(const char *m3_dir);

/* The forward's logits over the fixture's prompts within factor x the
 * error of PyTorch's bf16 run (max |lbf16 - hf|) of `want` (hf or target);
 * prints the figures; returns the bound. */
double gmt_check_logits_bound(mbd_backend *gb, mbd_bmodel *gm, const gmt_fixture *f,
                              const float *want, double factor, const char *what);

#endif
