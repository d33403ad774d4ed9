/* Stop-string matching with a held-back tail. Text before the held tail
 * cannot start a match (any suffix that is a prefix of a stop string is held),
 * so a search over the held text alone finds every match. */
#include "client/gateway/stop.h"

#include <stdlib.h>
#include <string.h>

void gw_stop_init(gw_stop *s, char *const *stop, size_t n) {
  memset(s, 0, sizeof *s);
  s->stop = stop;
  s->n_stop = n;
}

void gw_stop_free(gw_stop *s) {
  free(s->buf);
  memset(s, 0, sizeof *s);
}

static int append(char **out, size_t *len, const char *p, size_t n) {
  char *q = realloc(*out, *len + n + 1);
  if (!q) return -1;
  memcpy(q + *len, p, n);
  *len += n;
  q[*len] = '\0';
  *out = q;
  return 0;
}

/* Earliest match in buf[0..len): its offset, or len when none. */
static size_t first_match(const gw_stop *s) {
  size_t best = s->len;
  for (size_t k = 0; k < s->n_stop; k++) {
    size_t sl = strlen(s->stop[k]);
    for (size_t i = 0; i + sl <= s->len && i < best; i++)
      if (!memcmp(s->buf + i, s->stop[k], sl)) {
        best = i;
        break;
      }
  }
  return best;
}

/* Length of the longest suffix of buf that is a proper prefix of a stop string. */
static size_t held_tail(const gw_stop *s) {
  size_t hold = 0;
  for (size_t k = 0; k < s->n_stop; k++) {
    size_t sl = strlen(s->stop[k]);
    size_t max = sl - 1 < s->len ? sl - 1 : s->len;
    for (size_t t = max; t > hold; t--)
      if (!memcmp(s->buf + s->len - t, s->stop[k], t)) {
        hold = t;
        break;
      }
  }
  return hold;
}

int gw_stop_push(gw_stop *s, const char *text, size_t len, char **out, size_t *out_len) {
  if (s->hit) return 1;
  if (s->n_stop == 0) return append(out, out_len, text, len);
  if (len && append(&s->buf, &s->len, text, len)) return -1;
  size_t m = first_match(s);
  if (m < s->len) {
    s->hit = true;
    int rc = append(out, out_len, s->buf, m);
    s->len = 0;
    return rc ? -1 : 1;
  }
  size_t rel = s->len - held_tail(s);
  if (rel && append(out, out_len, s->buf, rel)) return -1;
  memmove(s->buf, s->buf + rel, s->len - rel);
  s->len -= rel;
  return 0;
}

int gw_stop_flush(gw_stop *s, char **out, size_t *out_len) {
  if (s->hit || s->len == 0) return 0;
  int rc = append(out, out_len, s->buf, s->len);
  s->len = 0;
  return rc;
}
