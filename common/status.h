/* Status codes and the error object every fallible function fills.
 *
 * Codes are stable: they travel on the wire (docs/protocol.md) and never get
 * renumbered. Functions return 0 (MBD_OK) or a negative code and, when given a
 * non-NULL mbd_error, write a message a person can act on. */
#ifndef MBD_STATUS_H
#define MBD_STATUS_H

#include <stddef.h>

typedef enum mbd_status {
  MBD_OK = 0,
  MBD_E_INVALID = -1,     /* bad argument or request field */
  MBD_E_IO = -2,          /* file or socket I/O failed */
  MBD_E_FORMAT = -3,      /* malformed file or message */
  MBD_E_NOMEM = -4,       /* allocation failed */
  MBD_E_UNSUPPORTED = -5, /* valid but not supported by this build/route */
  MBD_E_NO_ROUTE = -6,    /* no live worker matches the requested route */
  MBD_E_TIMEOUT = -7,     /* deadline passed */
  MBD_E_DEVICE = -8,      /* GPU / driver / cuBLAS failure */
  MBD_E_BUSY = -9,        /* queue full or resource in use */
  MBD_E_NOT_FOUND = -10,  /* unknown model, session, tensor, handle */
  MBD_E_SHAPE = -11,      /* tensor shape or dtype mismatch */
  MBD_E_STATE = -12,      /* operation not allowed in the current state */
  MBD_E_PROTOCOL = -13,   /* wrong magic, version or frame layout */
  MBD_E_TOO_LARGE = -14,  /* message or tensor over a configured limit */
  MBD_E_WORKER_LOST = -15,/* the worker serving the request died */
  MBD_E_UNUSABLE = -16,   /* context poisoned by an unverifiable failure */
  MBD_E_INTERNAL = -17,   /* invariant broken: a bug, please report */
  MBD_E_CANCELLED = -18,  /* the client cancelled the request, or went away */
} mbd_status;

#define MBD_ERROR_MSG_MAX 512

/* Caller-owned error slot. `code` mirrors the return value. */
typedef struct mbd_error {
  int code;                     /* an mbd_status */
  char msg[MBD_ERROR_MSG_MAX];  /* NUL-terminated, human-readable */
} mbd_error;

/* Records code + printf-style message in err (when non-NULL); returns code so
 * callers can write `return mbd_error_set(err, MBD_E_IO, "...")`. */
int mbd_error_set(mbd_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes err->msg with context ("loading model X: ..."); returns err->code. */
int mbd_error_prefix(mbd_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Resets err to MBD_OK with an empty message. NULL-safe. */
void mbd_error_clear(mbd_error *err);

/* Stable upper-case name of a code ("NO_ROUTE"); "UNKNOWN" for others. */
const char *mbd_status_name(int code);

#endif
