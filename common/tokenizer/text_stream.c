/* Prompt encoding and streamed text output for the CLIs (see text_stream.h). */
#include "common/tokenizer/text_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct mbd_text_stream {
  mbd_detok *detok; /* holds back a character split across ids */
  FILE *out;        /* borrowed; NULL: count only */
  size_t count;     /* ids pushed */
};

/* Reads all of `path` into *buf (the caller frees) of *len bytes. */
static int read_file(const char *path, char **buf, size_t *len, mbd_error *err) {
  FILE *f = fopen(path, "rb");
  char *p = NULL;
  size_t n = 0, cap = 0;
  if (!f) return mbd_error_set(err, MBD_E_IO, "%s: %s", path, strerror(errno));
  for (;;) {
    if (n == cap) {
      char *q = realloc(p, cap = 2 * cap + 65536);
      if (!q) {
        fclose(f);
        free(p);
        return mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory after %zu bytes", path, n);
      }
      p = q;
    }
    size_t got = fread(p + n, 1, cap - n, f);
    n += got;
    if (!got) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(p);
    return mbd_error_set(err, MBD_E_IO, "%s: read failed", path);
  }
  *buf = p;
  *len = n;
  return MBD_OK;
}

int mbd_text_prompt_ids(const mbd_tokenizer *t, const char *text, const char *file,
                        bool add_special, int64_t **ids, size_t *n, mbd_error *err) {
  char *bytes = NULL;
  size_t len = text ? strlen(text) : 0;
  int32_t *i32 = NULL;
  int rc = MBD_OK;
  *ids = NULL;
  *n = 0;
  if (file && (rc = read_file(file, &bytes, &len, err))) return rc;
  rc = mbd_tokenizer_encode(t, file ? bytes : (text ? text : ""), len, add_special, &i32, n, err);
  free(bytes);
  if (rc) return rc;
  if (!*n) {
    free(i32);
    return mbd_error_set(err, MBD_E_INVALID, "the prompt encodes to no tokens");
  }
  if (!(*ids = malloc(*n * sizeof **ids))) {
    free(i32);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for %zu prompt tokens", *n);
  }
  for (size_t i = 0; i < *n; i++) (*ids)[i] = i32[i];
  free(i32);
  return MBD_OK;
}

int mbd_text_stream_new(const mbd_tokenizer *t, bool skip_special, FILE *out,
                        mbd_text_stream **s, mbd_error *err) {
  *s = calloc(1, sizeof **s);
  if (!*s) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a text stream");
  int rc = mbd_detok_new(t, skip_special, &(*s)->detok, err);
  if (rc) {
    free(*s);
    *s = NULL;
    return rc;
  }
  (*s)->out = out;
  return MBD_OK;
}

void mbd_text_stream_destroy(mbd_text_stream **s) {
  if (!s || !*s) return;
  mbd_detok_destroy(&(*s)->detok);
  free(*s);
  *s = NULL;
}

/* Writes buf[0..len) and flushes. */
static int emit(mbd_text_stream *s, const char *buf, size_t len, mbd_error *err) {
  if (!s->out) return MBD_OK;
  if ((len && fwrite(buf, 1, len, s->out) != len) || fflush(s->out))
    return mbd_error_set(err, MBD_E_IO, "writing the generated text: %s", strerror(errno));
  return MBD_OK;
}

int mbd_text_stream_push(mbd_text_stream *s, const int64_t *ids, size_t n, mbd_error *err) {
  char *buf = NULL;
  size_t len = 0;
  int rc = MBD_OK;
  for (size_t i = 0; i < n; i++) { /* an id that is not text is skipped; the first one reported */
    mbd_error e = {0};
    int r = ids[i] < 0 || ids[i] > INT32_MAX
                ? mbd_error_set(&e, MBD_E_INVALID, "token %lld is not in the tokenizer's "
                                "vocabulary", (long long)ids[i])
                : mbd_detok_push(s->detok, (int32_t)ids[i], &buf, &len, &e);
    if (!r) s->count++;
    if (r && !rc) {
      rc = r;
      if (err) *err = e;
    }
  }
  int wrc = emit(s, buf, buf ? len : 0, err);
  free(buf);
  return rc ? rc : wrc;
}

int mbd_text_stream_finish(mbd_text_stream *s, mbd_error *err) {
  char *buf = NULL;
  size_t len = 0;
  int rc = mbd_detok_flush(s->detok, &buf, &len, err);
  if (!rc) rc = emit(s, buf, buf ? len : 0, err);
  free(buf);
  return rc;
}

size_t mbd_text_stream_count(const mbd_text_stream *s) { return s->count; }
