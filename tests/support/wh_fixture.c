/* The tiny-d64 fixture and its in-process reference (see wh_fixture.h). */
#include "support/wh_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wh_fixture_load(const wh *h, wh_fixture *f) {
  memset(f, 0, sizeof *f);
  char p[600];
  mbd_error e = {0};
  snprintf(p, sizeof p, "%s/expected.safetensors", h->model_dir);
  if (mbd_safetensors_open(p, &f->st, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return -1;
  }
  const mbd_st_entry *ids = mbd_safetensors_find(f->st, "input_ids");
  const mbd_st_entry *gr = mbd_safetensors_find(f->st, "greedy");
  if (!ids || !gr) {
    fprintf(stderr, "%s lacks input_ids or greedy\n", p);
    return -1;
  }
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->G = gr->desc.shape[1] - f->T;
  /* The mapping may be unaligned for i64: copy. */
  int64_t *a = malloc(ids->nbytes), *b = malloc(gr->nbytes);
  if (!a || !b) {
    free(a);
    free(b);
    return -1;
  }
  memcpy(a, ids->data, ids->nbytes);
  memcpy(b, gr->data, gr->nbytes);
  f->ids = a;
  f->greedy = b;
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  o.threads = 2;
  if (mbd_mamba1_load(h->model_dir, &o, &f->model, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return -1;
  }
  f->V = mbd_mamba1_vocab(f->model);
  return 0;
}

void wh_fixture_free(wh_fixture *f) {
  free((void *)f->ids);
  free((void *)f->greedy);
  mbd_mamba1_destroy(&f->model);
  mbd_safetensors_destroy(&f->st);
}

void wh_ref_prefill(wh_fixture *f, mbd_mamba1_state *s, const int64_t *ids, int64_t T,
                    float *logits) {
  int32_t *t = malloc((size_t)T * sizeof *t);
  if (!t) abort();
  for (int64_t i = 0; i < T; i++) t[i] = (int32_t)ids[i];
  const int32_t *row = t;
  mbd_error e = {0};
  if (mbd_mamba1_prefill(f->model, &s, 1, &row, &T, MBD_MAMBA1_LOGITS_ALL, logits, &e)) abort();
  free(t);
}
