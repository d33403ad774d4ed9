/* Tokenizer speed on one core: MB/s of English prose encoded (the prose and
 * corpus cases of the neox-like fixture, repeated to --mb MB), as one text and
 * line by line, and decode MB/s, for each fixture tokenizer. Prints a markdown
 * table (docs/benchmarks.md). bench_tokenizer_hf.py builds the same text and
 * prints Hugging Face tokenizers' figures for comparison.
 *   bench_tokenizer [--fixtures DIR] [--mb N] [--quick] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tokenizer/tokenizer.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The prose: texts of kinds prose, corpus_line and corpus_chunk, one per line,
 * repeated until `want` bytes. */
static char *build_text(const char *fixtures, size_t want, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizers/neox-like/cases.jsonl", fixtures);
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *one = NULL, *line = NULL;
  size_t one_len = 0, cap = 0;
  ssize_t got;
  while ((got = getline(&line, &cap, f)) > 0) {
    json_t *c = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, NULL);
    const char *kind = json_string_value(json_object_get(c, "kind"));
    const json_t *t = json_object_get(c, "text");
    if (kind && (!strcmp(kind, "prose") || !strncmp(kind, "corpus_", 7)) && json_string_length(t)) {
      size_t n = json_string_length(t);
      one = realloc(one, one_len + n + 1);
      memcpy(one + one_len, json_string_value(t), n);
      one_len += n;
      one[one_len++] = '\n';
    }
    json_decref(c);
  }
  free(line);
  fclose(f);
  if (!one_len) return NULL;
  char *text = malloc(want + one_len + 1);
  size_t n = 0;
  while (n < want) {
    memcpy(text + n, one, one_len);
    n += one_len;
  }
  text[n] = '\0';
  free(one);
  *len = n;
  return text;
}

int main(int argc, char **argv) {
  const char *fixtures = getenv("MBD_FIXTURES_DIR");
  double mb = 8;
  int reps = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fixtures") && i + 1 < argc) fixtures = argv[++i];
    else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) mb = 0.5, reps = 1;
    else {
      fprintf(stderr, "usage: bench_tokenizer [--fixtures DIR] [--mb N] [--quick]\n");
      return 2;
    }
  }
  if (!fixtures) fixtures = "../shared/fixtures";
  size_t len = 0;
  char *text = build_text(fixtures, (size_t)(mb * 1e6), &len);
  if (!text) {
    printf("bench_tokenizer: no fixtures under %s/tokenizers: skipped\n", fixtures);
    return 0;
  }
  printf("### Tokenizer, one core: English prose (%.1f MB, best of %d)\n\n", (double)len / 1e6, reps);
  printf("| tokenizer | encode, one text MB/s | encode, per line MB/s | tokens/s (per line) | decode MB/s | bytes/token |\n");
  printf("|---|---|---|---|---|---|\n");
  static const char *const names[] = {"neox-like", "qwen3", "gpt4o"};
  for (size_t k = 0; k < 3; k++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", fixtures, names[k]);
    mbd_tokenizer *t = NULL;
    mbd_error err = {0};
    if (mbd_tokenizer_load(dir, &t, &err)) {
      fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
      return 1;
    }
    double best_whole = 1e30, best_lines = 1e30, best_dec = 1e30;
    size_t n_tok = 0;
    int32_t *all = NULL;
    for (int r = 0; r < reps; r++) {
      int32_t *ids = NULL;
      size_t n = 0;
      double t0 = now_s();
      if (mbd_tokenizer_encode(t, text, len, false, &ids, &n, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
      }
      double t1 = now_s();
      if (t1 - t0 < best_whole) best_whole = t1 - t0;
      free(all);
      all = ids;
      n_tok = n;

      size_t lines_tok = 0;
      t0 = now_s();
      for (const char *p = text; p < text + len;) {
        const char *e = memchr(p, '\n', (size_t)(text + len - p));
        size_t l = e ? (size_t)(e - p) + 1 : (size_t)(text + len - p);
        int32_t *li = NULL;
        size_t ln = 0;
        if (mbd_tokenizer_encode(t, p, l, false, &li, &ln, &err)) {
          fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
          return 1;
        }
        lines_tok += ln;
        free(li);
        p += l;
      }
      t1 = now_s();
      if (t1 - t0 < best_lines) best_lines = t1 - t0;
      (void)lines_tok;

      char *s = NULL;
      size_t sl = 0;
      t0 = now_s();
      if (mbd_tokenizer_decode(t, all, n_tok, false, &s, &sl, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
      }
      t1 = now_s();
      if (t1 - t0 < best_dec) best_dec = t1 - t0;
      if (sl != len || memcmp(s, text, len)) {
        fprintf(stderr, "bench_tokenizer: note: %s: decode(encode(text)) != text (normalization)\n",
                names[k]);
      }
      free(s);
    }
    printf("| %s | %.1f | %.1f | %.2fM | %.0f | %.2f |\n", names[k], (double)len / 1e6 / best_whole,
           (double)len / 1e6 / best_lines, (double)n_tok / best_lines / 1e6, (double)len / 1e6 / best_dec,
           (double)len / (double)n_tok);
    free(all);
    mbd_tokenizer_destroy(&t);
  }
  free(text);
  return 0;
}
