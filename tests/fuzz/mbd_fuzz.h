/* Shared declarations for fuzz targets (tests/fuzz/fuzz_<name>.c).
 *
 * A target defines LLVMFuzzerTestOneInput and may define mbd_fuzz_seeds to hand
 * well-formed inputs to the smoke driver (fuzz_smoke_main.c), which mutates
 * them; the real libFuzzer build ignores the hook (use --write-seeds to turn
 * the seeds into a libFuzzer corpus). A target signals a broken invariant with
 * MBD_FUZZ_CHECK, which traps in both builds. */
#ifndef MBD_FUZZ_H
#define MBD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct mbd_fuzz_seed {
  const uint8_t *data;
  size_t len;
} mbd_fuzz_seed;

/* Optional hook: sets *out to an array of seeds (owned by the target, valid for
 * the process lifetime) and returns how many. */
size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out);

#define MBD_FUZZ_CHECK(cond)                                                           \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                \
    }                                                                                  \
  } while (0)

#endif
