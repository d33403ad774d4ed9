/* OpenAI-shaped error bodies and the status-to-HTTP mapping. */
#include "client/gateway/errors.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void copy(char *dst, size_t cap, const char *s) { snprintf(dst, cap, "%s", s ? s : ""); }

static int err_vset(gw_err *e, int http, const char *type, const char *code, const char *param,
                    const char *fmt, va_list ap) {
  e->http = http;
  copy(e->type, sizeof e->type, type);
  copy(e->code, sizeof e->code, code);
  copy(e->param, sizeof e->param, param);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  return -1;
}

int gw_err_set(gw_err *e, int http, const char *type, const char *code, const char *param,
               const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  err_vset(e, http, type, code, param, fmt, ap);
  va_end(ap);
  return -1;
}

int gw_err_bad(gw_err *e, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  err_vset(e, 400, "invalid_request_error", "invalid_value", param, fmt, ap);
  va_end(ap);
  return -1;
}

int gw_err_from_service(gw_err *e, const mbd_error *se, const char *what) {
  int http = 500;
  const char *type = "server_error";
  switch (se->code) {
  case MBD_E_NO_ROUTE:
    http = 503;
    type = "service_unavailable";
    break;
  case MBD_E_BUSY:
    http = 429;
    type = "rate_limit_error";
    break;
  case MBD_E_TIMEOUT:
    http = 504;
    type = "timeout";
    break;
  case MBD_E_INVALID:
  case MBD_E_SHAPE:
  case MBD_E_TOO_LARGE:
    http = 400;
    type = "invalid_request_error";
    break;
  case MBD_E_NOT_FOUND:
    http = 404;
    type = "invalid_request_error";
    break;
  case MBD_E_WORKER_LOST:
    http = 503;
    type = "service_unavailable";
    break;
  default: break;
  }
  char code[40];
  snprintf(code, sizeof code, "%s", mbd_status_name(se->code));
  for (char *p = code; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  return gw_err_set(e, http, type, code, NULL, "%s: %s", what, se->msg);
}

char *gw_err_json(const gw_err *e) {
  json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->msg, "type", e->type,
                        "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                        e->code[0] ? json_string(e->code) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}
