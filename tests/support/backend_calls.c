/* Backend calls for model tests (see backend_calls.h). */
#include "support/backend_calls.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>

#include <cmocka.h>

mbd_bmodel *bc_load(mbd_backend *b, const char *dir) {
  mbd_bmodel *m = NULL;
  mbd_error err = {0};
  if (b->ops->model_load(b, dir, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
  return m;
}

mbd_bstate *bc_new_state(mbd_backend *b, mbd_bmodel *m) {
  mbd_bstate *s = NULL;
  mbd_error err = {0};
  if (b->ops->state_new(b, m, &s, &err)) fail_msg("state: %s", err.msg);
  return s;
}

uint8_t *bc_save(mbd_backend *b, const mbd_bstate *s, size_t *n) {
  *n = b->ops->state_bytes(s);
  uint8_t *buf = malloc(*n);
  mbd_error err = {0};
  if (!buf) fail_msg("save: out of memory for %zu bytes", *n);
  if (b->ops->state_save(s, buf, *n, &err)) fail_msg("save: %s", err.msg);
  return buf;
}

void bc_decode_all(mbd_backend *b, mbd_bmodel *m, const int64_t *ids, int64_t T, int64_t V,
                   float *logits, uint8_t **img, size_t *n) {
  mbd_bstate *s = bc_new_state(b, m);
  mbd_error err = {0};
  for (int64_t t = 0; t < T; t++)
    if (b->ops->step(b, m, &s, ids + t, 1, logits + t * V, &err)) fail_msg("step: %s", err.msg);
  *img = bc_save(b, s, n);
  b->ops->state_free(b, s);
}
