/* OpenAI's error shape for every failure the gateway answers:
 *   {"error": {"message": "...", "type": "invalid_request_error",
 *              "param": "max_tokens" | null, "code": "..." | null}}
 * and the mapping from the service's status codes to HTTP statuses. */
#ifndef MBD_GW_ERRORS_H
#define MBD_GW_ERRORS_H

#include "common/status.h"

/* A failure to answer with: HTTP status + OpenAI fields. Plain data. */
typedef struct gw_err {
  int http;       /* 400, 404, 413, 429, 500, 503, 504 ... */
  char type[40];  /* "invalid_request_error", "server_error", ... */
  char code[40];  /* "model_not_found", "" = null */
  char param[40]; /* the request field at fault, "" = null */
  char msg[1024];
} gw_err;

/* Fills e; returns -1 so parsers can `return gw_err_set(...)`. */
int gw_err_set(gw_err *e, int http, const char *type, const char *code, const char *param,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A 400 invalid_request_error naming `param`. */
int gw_err_bad(gw_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Maps a service failure (libmambad's status + message) to an HTTP error:
 * NO_ROUTE 503, BUSY 429, TIMEOUT 504, INVALID/SHAPE/TOO_LARGE 400,
 * NOT_FOUND 404, WORKER_LOST 503, others 500. */
int gw_err_from_service(gw_err *e, const mbd_error *se, const char *what);
/* The JSON body (malloc'd, caller frees). */
char *gw_err_json(const gw_err *e);

#endif
