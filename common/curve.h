/* CURVE key pairs: files, generation, and socket set-up for the three roles
 * that connect to a broker over tcp (clients, workers, gateways) and for the
 * broker itself. Keys are Z85 text (40 characters, zmq_z85_encode of 32 bytes).
 *
 * Files: a public key file is one line holding the Z85 public key; a secret
 * file is two lines "public <z85>" and "secret <z85>", mode 0600 (a secret file
 * readable by group or others is refused). `mambad keygen` writes both. */
#ifndef MBD_CURVE_H
#define MBD_CURVE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

#define MBD_CURVE_KEY_LEN 40 /* Z85 characters */

typedef struct mbd_curve_pair {
  char public_key[MBD_CURVE_KEY_LEN + 1];
  char secret_key[MBD_CURVE_KEY_LEN + 1];
} mbd_curve_pair;

/* True when s is exactly 40 Z85 characters that decode. */
bool mbd_curve_key_valid(const char *s);

/* A fresh key pair (zmq_curve_keypair). MBD_E_UNSUPPORTED without CURVE. */
int mbd_curve_generate(mbd_curve_pair *out, mbd_error *err);
/* Writes <prefix>.key (secret, 0600, created exclusively) and <prefix>.pub. */
int mbd_curve_write(const char *prefix, const mbd_curve_pair *p, mbd_error *err);
/* Reads a secret file (see above); MBD_E_INVALID naming the file when it is
 * malformed or its mode lets group or others read it. */
int mbd_curve_read_secret(const char *path, mbd_curve_pair *out, mbd_error *err);
/* Reads a public key from a file (first line) or, when `spec` is itself a
 * valid key, takes it as is. */
int mbd_curve_read_public(const char *spec, char out[MBD_CURVE_KEY_LEN + 1], mbd_error *err);

/* A connecting socket (DEALER) as a CURVE client of the server key. */
int mbd_curve_client(void *socket, const mbd_curve_pair *own, const char *server_public,
                     mbd_error *err);
/* A bound socket as a CURVE server with secret key `own`, authenticated by the
 * ZAP handler under `domain`. */
int mbd_curve_server(void *socket, const mbd_curve_pair *own, const char *domain, mbd_error *err);

#endif
