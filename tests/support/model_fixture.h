/* The reference fixtures of the model tests: MBD_FIXTURES_DIR/<family>/<case>/
 * with config.json, model.safetensors and expected.safetensors (formats in
 * the fixtures' README.md), read into one struct, and the loop over a
 * family's cases that skips the test when none of them is present. */
#ifndef MBD_TESTS_SUPPORT_MODEL_FIXTURE_H
#define MBD_TESTS_SUPPORT_MODEL_FIXTURE_H

#include <stdint.h>

/* One case. The f32 entries are copies (the mapped file gives no alignment);
 * an entry the case does not hold is NULL. */
typedef struct mf_fixture {
  char dir[1024];           /* the case's folder: config.json, model.safetensors */
  const char *name;         /* the case's name, for messages */
  int B, T, G, V;           /* sequences, prompt tokens, greedy steps, vocabulary rows */
  int32_t *ids;             /* [B, T] input_ids as the models' token type */
  int64_t *greedy;          /* [B, T + G] each prompt, then the reference's greedy picks */
  float *logits;            /* [B, T, V] the float64 reference, rounded to f32 */
  float *logits_bf16;       /* [B, T, V] PyTorch's bf16 run (Mamba-1, Mamba-2) */
  float *logits_bf16_triton; /* [B, T, V] upstream's bf16 Triton run (Mamba-3) */
  float *greedy_logits;     /* [B, G, V] the reference's logits at the greedy steps */
  float *logits_norm_per_group; /* [B, T, V] Mamba-2 with n_groups > 1: the per-group norm */
  const float *target;      /* the logits to match: logits_norm_per_group, else logits */
} mf_fixture;

/* Reads case `name` of `family` ("mamba1", "mamba2", "mamba3"); -1, with a
 * line saying it is skipped, when MBD_FIXTURES_DIR is unset or the case is
 * absent. Fails the test when input_ids, logits, greedy or an entry that
 * every case of the family holds is missing (Mamba-1 and Mamba-2:
 * logits_bf16; Mamba-3: logits_bf16_triton; Mamba-2 and Mamba-3:
 * greedy_logits). */
int mf_fixture_load(const char *family, const char *name, mf_fixture *f);
/* Frees what mf_fixture_load read; the struct is zeroed. */
void mf_fixture_free(mf_fixture *f);

/* Greedy token g of sequence b, the g-th after its prompt. */
int64_t mf_greedy_token(const mf_fixture *f, int b, int g);

/* Runs check(f, c) for each present case c of cases[0 .. n) of `family`,
 * freeing it after; skips the test when no case is present. */
void mf_for_each_case(const char *family, const char *const *cases, int n,
                      void (*check)(const mf_fixture *f, int c));

#endif
