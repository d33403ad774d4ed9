/* Stop strings over streamed text: text arrives in pieces (one token's worth
 * at a time); the matcher releases only text that can no longer be the start
 * of a stop string, so a stop string split across tokens is found and no
 * part of it is ever emitted. */
#ifndef MBD_GW_STOP_H
#define MBD_GW_STOP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gw_stop {
  char *const *stop; /* borrowed stop strings */
  size_t n_stop;
  char *buf; /* text received and not yet released */
  size_t len, cap;
  bool hit; /* a stop string was found: nothing more is released */
} gw_stop;

/* stop[0..n) are borrowed for the matcher's life. */
void gw_stop_init(gw_stop *s, char *const *stop, size_t n);
void gw_stop_free(gw_stop *s);
/* Adds text; appends what may be released to *out (realloc'd, *out_len
 * updated, NUL-terminated). Returns 1 when a stop string was found (the text
 * before it is released, the rest dropped), 0 otherwise, -1 out of memory. */
int gw_stop_push(gw_stop *s, const char *text, size_t len, char **out, size_t *out_len);
/* End of text: releases what was held back (a partial stop string at the end
 * is text after all). */
int gw_stop_flush(gw_stop *s, char **out, size_t *out_len);

#endif
