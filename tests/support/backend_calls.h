/* Backend calls for model tests: each wraps one op of kernels/backend.h and
 * fails the cmocka test with the op's message when it does not succeed. */
#ifndef MBD_TESTS_SUPPORT_BACKEND_CALLS_H
#define MBD_TESTS_SUPPORT_BACKEND_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

mbd_bmodel *bc_load(mbd_backend *b, const char *dir);
mbd_bstate *bc_new_state(mbd_backend *b, mbd_bmodel *m);
/* The state's image; *n gets its size; the caller frees it. */
uint8_t *bc_save(mbd_backend *b, const mbd_bstate *s, size_t *n);
/* Token by token from a fresh state: logits [T, V] and the state image
 * (*img, *n, as bc_save). */
void bc_decode_all(mbd_backend *b, mbd_bmodel *m, const int64_t *ids, int64_t T, int64_t V,
                   float *logits, uint8_t **img, size_t *n);

#endif
