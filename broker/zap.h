/* The broker's ZAP handler (ZeroMQ RFC 27): which CURVE public keys may
 * connect, per role. Every tcp endpoint of the broker is a CURVE server whose
 * ZAP domain names its role ("clients" or "workers"); libzmq asks this handler
 * about every handshake on inproc://zeromq.zap.01, and the reactor answers from
 * the same thread (mbd_zap_serve). Admitted peers get User-Id "key:<z85>"
 * ("op:<z85>" for an operator key on the clients endpoint), which the broker
 * stamps as the request's caller. Rejections are logged with the key and the
 * peer address. The decision (mbd_zap_decide) is a pure function of the
 * request frames, for tests and fuzzing. */
#ifndef MBD_BROKER_ZAP_H
#define MBD_BROKER_ZAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/status.h"

#define MBD_ZAP_MAX_KEYS 1024
#define MBD_ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef enum mbd_zap_role { MBD_ZAP_CLIENTS = 0, MBD_ZAP_WORKERS = 1, MBD_ZAP_OPERATORS = 2 } mbd_zap_role;

typedef struct mbd_zap_keys mbd_zap_keys;

int mbd_zap_keys_new(mbd_zap_keys **out, mbd_error *err);
void mbd_zap_keys_destroy(mbd_zap_keys **k);
/* Adds the keys of `spec` to a role: a Z85 key, a file with one key per line
 * (lines starting with '#' are comments), or a directory whose *.pub files hold one key each (as
 * `mambad keygen` writes them). Several specs may be given, comma-separated.
 * MBD_E_INVALID naming the file and line of a bad key. */
int mbd_zap_keys_add(mbd_zap_keys *k, mbd_zap_role role, const char *spec, mbd_error *err);
size_t mbd_zap_keys_count(const mbd_zap_keys *k, mbd_zap_role role);

/* The verdict on one ZAP request. */
typedef struct mbd_zap_verdict {
  bool ok;                 /* status 200 */
  char status[4];          /* "200", "400" (refused) or "500" (malformed request) */
  char text[96];           /* status text */
  char user_id[48];        /* "key:<z85>" / "op:<z85>" when ok */
  char key[MBD_CURVE_KEY_LEN + 1]; /* the peer's key (Z85), "" when none was readable */
  char domain[16];         /* "clients" / "workers" when readable */
} mbd_zap_verdict;

/* Decides a ZAP request given as frames (data[i], len[i]), i < n:
 * version "1.0", request id, domain, address, identity, mechanism, credentials.
 * Only mechanism CURVE with a 32-byte key listed for the domain's role is
 * admitted; anything else is refused or malformed. Never reads past len. */
void mbd_zap_decide(const mbd_zap_keys *k, const uint8_t *const *data, const size_t *len, size_t n,
                    mbd_zap_verdict *out);

/* Answers every ZAP request queued on `zap` (a REP socket bound to
 * MBD_ZAP_ENDPOINT) without blocking; logs each rejection with the key and the
 * peer address (a key refused again within 10 s is counted, not logged). */
void mbd_zap_serve(void *zap, mbd_zap_keys *k);

#endif
