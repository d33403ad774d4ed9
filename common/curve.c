/* CURVE key files and socket options. See curve.h. */
#include "common/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

bool mbd_curve_key_valid(const char *s) {
  if (!s || strlen(s) != MBD_CURVE_KEY_LEN) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, s) != NULL;
}

int mbd_curve_generate(mbd_curve_pair *out, mbd_error *err) {
  memset(out, 0, sizeof *out);
  if (!zmq_has("curve"))
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "this libzmq is built without CURVE");
  if (zmq_curve_keypair(out->public_key, out->secret_key))
    return mbd_error_set(err, MBD_E_IO, "zmq_curve_keypair: %s", zmq_strerror(errno));
  return MBD_OK;
}

int mbd_curve_write(const char *prefix, const mbd_curve_pair *p, mbd_error *err) {
  char sec[4096], pub[4096];
  if ((size_t)snprintf(sec, sizeof sec, "%s.key", prefix) >= sizeof sec ||
      (size_t)snprintf(pub, sizeof pub, "%s.pub", prefix) >= sizeof pub)
    return mbd_error_set(err, MBD_E_INVALID, "key path prefix too long");
  int fd = open(sec, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return mbd_error_set(err, MBD_E_IO, "cannot create %s: %s (an existing key is never "
                         "overwritten)", sec, strerror(errno));
  char buf[128];
  int n = snprintf(buf, sizeof buf, "public %s\nsecret %s\n", p->public_key, p->secret_key);
  bool ok = fchmod(fd, 0600) == 0 && write(fd, buf, (size_t)n) == n;
  ok = close(fd) == 0 && ok;
  if (!ok) return mbd_error_set(err, MBD_E_IO, "cannot write %s: %s", sec, strerror(errno));
  FILE *f = fopen(pub, "w");
  if (!f) return mbd_error_set(err, MBD_E_IO, "cannot create %s: %s", pub, strerror(errno));
  ok = fprintf(f, "%s\n", p->public_key) > 0;
  ok = fclose(f) == 0 && ok;
  if (!ok) return mbd_error_set(err, MBD_E_IO, "cannot write %s", pub);
  return MBD_OK;
}

int mbd_curve_read_secret(const char *path, mbd_curve_pair *out, mbd_error *err) {
  memset(out, 0, sizeof *out);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return mbd_error_set(err, MBD_E_IO, "cannot open key file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (st.st_mode & 077)) {
    close(fd);
    return mbd_error_set(err, MBD_E_INVALID,
                         "secret key file %s must be a regular file of mode 0600 (chmod 600 %s)",
                         path, path);
  }
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return mbd_error_set(err, MBD_E_IO, "reading %s: %s", path, strerror(errno));
  buf[n] = '\0';
  char pubk[64] = "", seck[64] = "";
  if (sscanf(buf, "public %63s secret %63s", pubk, seck) != 2 || !mbd_curve_key_valid(pubk) ||
      !mbd_curve_key_valid(seck))
    return mbd_error_set(err, MBD_E_INVALID,
                         "%s is not a mambad secret key file (\"public <z85>\\nsecret <z85>\"; "
                         "make one with `mambad keygen`)", path);
  memcpy(out->public_key, pubk, MBD_CURVE_KEY_LEN + 1);
  memcpy(out->secret_key, seck, MBD_CURVE_KEY_LEN + 1);
  return MBD_OK;
}

int mbd_curve_read_public(const char *spec, char out[MBD_CURVE_KEY_LEN + 1], mbd_error *err) {
  out[0] = '\0';
  if (mbd_curve_key_valid(spec)) {
    memcpy(out, spec, MBD_CURVE_KEY_LEN + 1);
    return MBD_OK;
  }
  FILE *f = fopen(spec, "r");
  if (!f)
    return mbd_error_set(err, MBD_E_INVALID, "'%s' is neither a Z85 public key nor a readable "
                         "key file: %s", spec, strerror(errno));
  char line[128] = "";
  char *got = fgets(line, sizeof line, f);
  fclose(f);
  line[strcspn(line, "\r\n")] = '\0';
  char *k = line;
  if (!strncmp(k, "public ", 7)) k += 7; /* a secret file's first line works too */
  if (!got || !mbd_curve_key_valid(k))
    return mbd_error_set(err, MBD_E_INVALID, "%s holds no Z85 public key on its first line", spec);
  memcpy(out, k, MBD_CURVE_KEY_LEN + 1);
  return MBD_OK;
}

int mbd_curve_client(void *s, const mbd_curve_pair *own, const char *server_public,
                     mbd_error *err) {
  if (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_public, MBD_CURVE_KEY_LEN + 1) ||
      zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, own->public_key, MBD_CURVE_KEY_LEN + 1) ||
      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, own->secret_key, MBD_CURVE_KEY_LEN + 1))
    return mbd_error_set(err, MBD_E_IO, "setting CURVE client keys: %s", zmq_strerror(errno));
  return MBD_OK;
}

int mbd_curve_server(void *s, const mbd_curve_pair *own, const char *domain, mbd_error *err) {
  int one = 1;
  if (zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) ||
      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, own->secret_key, MBD_CURVE_KEY_LEN + 1) ||
      zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, domain, strlen(domain)))
    return mbd_error_set(err, MBD_E_IO, "setting CURVE server options: %s", zmq_strerror(errno));
  return MBD_OK;
}
