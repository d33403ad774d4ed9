/* Error object helpers and the stable code -> name table. */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mbd_error_set(mbd_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int mbd_error_prefix(mbd_error *err, const char *fmt, ...) {
  if (!err) return MBD_E_INTERNAL;
  char prefix[MBD_ERROR_MSG_MAX];
  char old[MBD_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof old);
  /* Truncation is acceptable: the message stays NUL-terminated. */
  size_t n = strnlen(prefix, sizeof prefix - 1);
  memcpy(err->msg, prefix, n);
  size_t room = sizeof err->msg - n;
  if (room > 3) {
    memcpy(err->msg + n, ": ", 2);
    size_t m = strnlen(old, room - 3);
    memcpy(err->msg + n + 2, old, m);
    n += 2 + m;
  }
  err->msg[n] = '\0';
  return err->code;
}

void mbd_error_clear(mbd_error *err) {
  if (!err) return;
  err->code = MBD_OK;
  err->msg[0] = '\0';
}

const char *mbd_status_name(int code) {
  switch (code) {
    case MBD_OK: return "OK";
    case MBD_E_INVALID: return "INVALID";
    case MBD_E_IO: return "IO";
    case MBD_E_FORMAT: return "FORMAT";
    case MBD_E_NOMEM: return "NOMEM";
    case MBD_E_UNSUPPORTED: return "UNSUPPORTED";
    case MBD_E_NO_ROUTE: return "NO_ROUTE";
    case MBD_E_TIMEOUT: return "TIMEOUT";
    case MBD_E_DEVICE: return "DEVICE";
    case MBD_E_BUSY: return "BUSY";
    case MBD_E_NOT_FOUND: return "NOT_FOUND";
    case MBD_E_SHAPE: return "SHAPE";
    case MBD_E_STATE: return "STATE";
    case MBD_E_PROTOCOL: return "PROTOCOL";
    case MBD_E_TOO_LARGE: return "TOO_LARGE";
    case MBD_E_WORKER_LOST: return "WORKER_LOST";
    case MBD_E_UNUSABLE: return "UNUSABLE";
    case MBD_E_INTERNAL: return "INTERNAL";
    case MBD_E_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}
