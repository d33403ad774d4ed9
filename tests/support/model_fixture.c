/* The model tests' reference fixtures (see model_fixture.h). */
#include "support/model_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/safetensors.h"

static float *copy_f32(const mbd_safetensors *st, const char *name) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  if (!e) return NULL;
  float *v = malloc(e->nbytes);
  assert_non_null(v);
  memcpy(v, e->data, e->nbytes);
  return v;
}

/* The entries beyond input_ids, logits and greedy that every case of a
 * family holds (the fixtures' README.md). */
static const struct {
  const char *family;
  const char *entries[3];
} k_family_entries[] = {
    {"mamba1", {"logits_bf16"}},
    {"mamba2", {"logits_bf16", "greedy_logits"}},
    {"mamba3", {"logits_bf16_triton", "greedy_logits"}},
};

static void check_family_entries(const mbd_safetensors *st, const char *family,
                                 const char *name) {
  for (size_t i = 0; i < sizeof k_family_entries / sizeof k_family_entries[0]; i++) {
    if (strcmp(k_family_entries[i].family, family)) continue;
    for (int k = 0; k < 3 && k_family_entries[i].entries[k]; k++)
      if (!mbd_safetensors_find(st, k_family_entries[i].entries[k]))
        fail_msg("fixture %s/%s: no %s", family, name, k_family_entries[i].entries[k]);
  }
}

int mf_fixture_load(const char *family, const char *name, mf_fixture *f) {
  memset(f, 0, sizeof *f);
  f->name = name;
  const char *root = getenv("MBD_FIXTURES_DIR");
  char path[1200];
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  if (root) {
    snprintf(f->dir, sizeof f->dir, "%s/%s/%s", root, family, name);
    snprintf(path, sizeof path, "%s/expected.safetensors", f->dir);
  }
  if (!root || mbd_safetensors_open(path, &st, &err)) {
    print_message("fixture %s/%s not found under $MBD_FIXTURES_DIR: skipped\n", family, name);
    return -1;
  }
  const mbd_st_entry *ids = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(st, "logits");
  const mbd_st_entry *gr = mbd_safetensors_find(st, "greedy");
  assert_non_null(ids);
  assert_non_null(lg);
  assert_non_null(gr);
  check_family_entries(st, family, name);
  f->B = (int)ids->desc.shape[0];
  f->T = (int)ids->desc.shape[1];
  f->V = (int)lg->desc.shape[2];
  f->G = (int)gr->desc.shape[1] - f->T;
  f->ids = malloc((size_t)f->B * f->T * sizeof(int32_t));
  assert_non_null(f->ids);
  for (int i = 0; i < f->B * f->T; i++) {
    int64_t v;
    memcpy(&v, (const char *)ids->data + 8 * i, 8);
    f->ids[i] = (int32_t)v;
  }
  f->greedy = malloc(gr->nbytes);
  assert_non_null(f->greedy);
  memcpy(f->greedy, gr->data, gr->nbytes);
  f->logits = copy_f32(st, "logits");
  f->logits_bf16 = copy_f32(st, "logits_bf16");
  f->logits_bf16_triton = copy_f32(st, "logits_bf16_triton");
  f->greedy_logits = copy_f32(st, "greedy_logits");
  f->logits_norm_per_group = copy_f32(st, "logits_norm_per_group");
  f->target = f->logits_norm_per_group ? f->logits_norm_per_group : f->logits;
  mbd_safetensors_destroy(&st);
  return 0;
}

void mf_fixture_free(mf_fixture *f) {
  free(f->ids);
  free(f->greedy);
  free(f->logits);
  free(f->logits_bf16);
  free(f->logits_bf16_triton);
  free(f->greedy_logits);
  free(f->logits_norm_per_group);
  memset(f, 0, sizeof *f);
}

int64_t mf_greedy_token(const mf_fixture *f, int b, int g) {
  return f->greedy[(size_t)b * (f->T + f->G) + f->T + g];
}

void mf_for_each_case(const char *family, const char *const *cases, int n,
                      void (*check)(const mf_fixture *f, int c)) {
  int ran = 0;
  for (int c = 0; c < n; c++) {
    mf_fixture f;
    if (mf_fixture_load(family, cases[c], &f)) continue;
    ran++;
    check(&f, c);
    mf_fixture_free(&f);
  }
  if (!ran) skip();
}
