/* Standalone fuzz driver: a deterministic mutation loop for compilers without
 * libFuzzer, run by CTest as fuzz_smoke_<name> on every build (with
 * MBD_SANITIZE=ON it catches memory errors too).
 *
 * Usage: fuzz_smoke_<name> [-n ITERS] [--write-seeds DIR] [FILE|DIR ...]
 *   Runs each seed (target hook + files given) as-is, then ITERS inputs
 *   (default 20000, or $MBD_FUZZ_ITERS): random bytes, or 1-8 mutations of a
 *   seed. The PRNG is seeded with a constant, so a failure reproduces exactly;
 *   set MBD_FUZZ_TRACE=path to have each input written there before it runs
 *   (the file then holds the crashing input). Every input lives in its own
 *   exactly-sized heap block so AddressSanitizer sees one-byte overreads. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mbd_fuzz.h"

/* Weak: targets without seeds need not define it. */
extern size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) __attribute__((weak));

#define FUZZ_MAX_INPUT 65536
#define FUZZ_MAX_SEEDS 1024

typedef struct seed_set {
  mbd_fuzz_seed s[FUZZ_MAX_SEEDS];
  size_t n;
  uint8_t *owned[FUZZ_MAX_SEEDS]; /* file seeds, freed at exit so LeakSanitizer stays quiet */
  size_t n_owned;
} seed_set;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static const char *g_trace;

static void run_one(const uint8_t *data, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  if (len) memcpy(copy, data, len);
  if (g_trace) {
    FILE *f = fopen(g_trace, "wb");
    if (f) {
      fwrite(copy, 1, len, f);
      fclose(f);
    }
  }
  LLVMFuzzerTestOneInput(len ? copy : NULL, len);
  free(copy);
}

static void add_file(seed_set *ss, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f || ss->n >= FUZZ_MAX_SEEDS) {
    if (f) fclose(f);
    return;
  }
  uint8_t *buf = malloc(FUZZ_MAX_INPUT);
  size_t n = buf ? fread(buf, 1, FUZZ_MAX_INPUT, f) : 0;
  fclose(f);
  if (!buf) return;
  ss->owned[ss->n_owned++] = buf;
  ss->s[ss->n++] = (mbd_fuzz_seed){buf, n};
}

static void add_path(seed_set *ss, const char *path) {
  struct stat sb;
  if (stat(path, &sb)) {
    fprintf(stderr, "fuzz_smoke: seed path %s not found, ignored\n", path);
    return;
  }
  if (!S_ISDIR(sb.st_mode)) {
    add_file(ss, path);
    return;
  }
  DIR *d = opendir(path);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, de->d_name);
    add_file(ss, p);
  }
  if (d) closedir(d);
}

/* Bytes that tend to matter to parsers of JSON, lengths and UTF-8. */
static const uint8_t k_interesting[] = {0,   1,   0x7f, 0x80, 0xff, '"', '{', '}', '[', ']',
                                        ',', ':', '-',  '0',  '9',  'e', '.', '\\', 'u', 0xc3};

static size_t mutate(uint8_t *b, size_t len, const seed_set *ss) {
  /* Mostly 1-2 edits: inputs stay close to a seed and get past length checks. */
  int rounds = 1;
  while (rounds < 8 && below(3) == 0) rounds++;
  for (int r = 0; r < rounds; r++) {
    size_t op = below(40);
    op = op < 36 ? op % 7 : 7 + (op - 36) / 2; /* 7 (u64 length) and 8 (splice) are rarer */
    switch (op) {
      case 0: /* flip a bit */
        if (len) b[below(len)] ^= (uint8_t)(1u << below(8));
        break;
      case 1: /* random byte */
        if (len) b[below(len)] = (uint8_t)rnd();
        break;
      case 2: /* interesting byte */
        if (len) b[below(len)] = k_interesting[below(sizeof k_interesting)];
        break;
      case 3: /* insert a byte */
        if (len < FUZZ_MAX_INPUT) {
          size_t at = below(len + 1);
          memmove(b + at + 1, b + at, len - at);
          b[at] = k_interesting[below(sizeof k_interesting)];
          len++;
        }
        break;
      case 4: { /* delete a range */
        if (!len) break;
        size_t at = below(len), n = 1 + below(len - at < 16 ? len - at : 16);
        memmove(b + at, b + at + n, len - at - n);
        len -= n;
        break;
      }
      case 5: /* truncate */
        len = below(len + 1);
        break;
      case 6: { /* duplicate a chunk */
        if (!len) break;
        size_t at = below(len), n = 1 + below(len - at < 64 ? len - at : 64);
        if (len + n > FUZZ_MAX_INPUT) break;
        size_t to = below(len + 1);
        uint8_t tmp[64];
        memcpy(tmp, b + at, n);
        memmove(b + to + n, b + to, len - to);
        memcpy(b + to, tmp, n);
        len += n;
        break;
      }
      case 7: /* overwrite a little-endian u64 with an edge value (length fields) */
        if (len >= 8) {
          static const uint64_t edge[] = {0, 1, 7, 8, 0x7fffffffffffffffull, ~0ull, 100000001};
          uint64_t v = edge[below(sizeof edge / sizeof edge[0])];
          if (below(2)) v = rnd() % (len + 16);
          size_t at = below(2) ? 0 : below(len - 7);
          for (int i = 0; i < 8; i++) b[at + (size_t)i] = (uint8_t)(v >> (8 * i));
        }
        break;
      case 8: { /* splice the tail of another seed */
        if (!ss->n) break;
        const mbd_fuzz_seed *o = &ss->s[below(ss->n)];
        size_t at = below(len + 1), from = below(o->len + 1), n = o->len - from;
        if (at + n > FUZZ_MAX_INPUT) n = FUZZ_MAX_INPUT - at;
        memcpy(b + at, o->data + from, n);
        len = at + n;
        break;
      }
    }
  }
  return len;
}

static int write_seeds(const seed_set *ss, const char *dir) {
  for (size_t i = 0; i < ss->n; i++) {
    char p[4096];
    snprintf(p, sizeof p, "%s/seed-%03zu", dir, i);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(ss->s[i].data, 1, ss->s[i].len, f) != ss->s[i].len) {
      fprintf(stderr, "fuzz_smoke: cannot write %s\n", p);
      if (f) fclose(f);
      return 1;
    }
    fclose(f);
  }
  printf("wrote %zu seeds to %s\n", ss->n, dir);
  return 0;
}

int main(int argc, char **argv) {
  static seed_set ss;
  long iters = 20000;
  const char *env = getenv("MBD_FUZZ_ITERS");
  const char *seed_out = NULL;
  if (env) iters = atol(env);
  g_trace = getenv("MBD_FUZZ_TRACE");
  if (mbd_fuzz_seeds) {
    const mbd_fuzz_seed *s = NULL;
    size_t n = mbd_fuzz_seeds(&s);
    for (size_t i = 0; i < n && ss.n < FUZZ_MAX_SEEDS; i++) ss.s[ss.n++] = s[i];
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atol(argv[++i]);
    else if (!strcmp(argv[i], "--write-seeds") && i + 1 < argc) seed_out = argv[++i];
    else add_path(&ss, argv[i]);
  }
  if (seed_out) {
    int rc = write_seeds(&ss, seed_out);
    for (size_t i = 0; i < ss.n_owned; i++) free(ss.owned[i]);
    return rc;
  }

  clock_t t0 = clock();
  for (size_t i = 0; i < ss.n; i++) run_one(ss.s[i].data, ss.s[i].len);
  uint8_t *buf = malloc(FUZZ_MAX_INPUT);
  if (!buf) return 2;
  for (long it = 0; it < iters; it++) {
    size_t len;
    if (!ss.n || below(4) == 0) {
      len = below(below(8) ? 512 : 4096);
      for (size_t j = 0; j < len; j++) buf[j] = (uint8_t)rnd();
      if (len >= 8 && below(4)) { /* plausible small length prefix */
        uint64_t hl = below(len);
        for (int k = 0; k < 8; k++) buf[k] = (uint8_t)(hl >> (8 * k));
      }
    } else {
      const mbd_fuzz_seed *s = &ss.s[below(ss.n)];
      len = s->len > FUZZ_MAX_INPUT ? FUZZ_MAX_INPUT : s->len;
      memcpy(buf, s->data, len);
      len = mutate(buf, len, &ss);
    }
    run_one(buf, len);
  }
  free(buf);
  for (size_t i = 0; i < ss.n_owned; i++) free(ss.owned[i]);
  printf("fuzz_smoke: %zu seeds + %ld generated inputs, no crash (%.2f s)\n", ss.n, iters,
         (double)(clock() - t0) / CLOCKS_PER_SEC);
  return 0;
}
