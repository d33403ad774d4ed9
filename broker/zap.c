/* ZAP handler: per-role CURVE key lists and the admission decision. */
#include "broker/zap.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

#include "common/log.h"

#define LOG "zap"
#define ZAP_MAX_FRAMES 16

struct mbd_zap_keys {
  char (*keys[3])[MBD_CURVE_KEY_LEN + 1]; /* per role, sorted after each add */
  size_t n[3], cap[3];
  char last_key[MBD_CURVE_KEY_LEN + 1];   /* last rejection logged (a refused peer retries) */
  int64_t last_ms;
  uint64_t quiet;                         /* rejections of that key not logged since */
};

int mbd_zap_keys_new(mbd_zap_keys **out, mbd_error *err) {
  *out = calloc(1, sizeof **out);
  return *out ? MBD_OK : mbd_error_set(err, MBD_E_NOMEM, "out of memory for the key lists");
}

void mbd_zap_keys_destroy(mbd_zap_keys **pk) {
  if (!pk || !*pk) return;
  for (int r = 0; r < 3; r++) free((*pk)->keys[r]);
  free(*pk);
  *pk = NULL;
}

static int cmp_key(const void *a, const void *b) { return strcmp(a, b); }

static int add_one(mbd_zap_keys *k, mbd_zap_role role, const char *key, const char *where,
                   mbd_error *err) {
  if (!mbd_curve_key_valid(key))
    return mbd_error_set(err, MBD_E_INVALID, "%s: '%.60s' is not a 40-character Z85 CURVE public key",
                         where, key);
  if (k->n[role] >= MBD_ZAP_MAX_KEYS)
    return mbd_error_set(err, MBD_E_INVALID, "%s: more than %d keys for one role", where,
                         MBD_ZAP_MAX_KEYS);
  if (k->n[role] == k->cap[role]) {
    size_t cap = k->cap[role] ? 2 * k->cap[role] : 16;
    void *p = realloc(k->keys[role], cap * sizeof *k->keys[role]);
    if (!p) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for keys");
    k->keys[role] = p;
    k->cap[role] = cap;
  }
  memcpy(k->keys[role][k->n[role]++], key, MBD_CURVE_KEY_LEN + 1);
  qsort(k->keys[role], k->n[role], sizeof *k->keys[role], cmp_key);
  return MBD_OK;
}

/* One key per line; blank lines and lines starting with '#' skipped. */
static int add_file(mbd_zap_keys *k, mbd_zap_role role, const char *path, mbd_error *err) {
  FILE *f = fopen(path, "r");
  if (!f) return mbd_error_set(err, MBD_E_INVALID, "cannot read key file %s: %s", path, strerror(errno));
  char line[256], where[1100];
  int ln = 0, rc = MBD_OK;
  while (!rc && fgets(line, sizeof line, f)) {
    ln++;
    char *s = line + strspn(line, " \t");
    s[strcspn(s, " \t\r\n")] = '\0'; /* '#' is a Z85 digit: comments only start a line */
    if (!*s || *s == '#') continue;
    snprintf(where, sizeof where, "%s:%d", path, ln);
    rc = add_one(k, role, s, where, err);
  }
  fclose(f);
  return rc;
}

static int add_dir(mbd_zap_keys *k, mbd_zap_role role, const char *path, mbd_error *err) {
  DIR *d = opendir(path);
  if (!d) return mbd_error_set(err, MBD_E_INVALID, "cannot read key directory %s: %s", path, strerror(errno));
  struct dirent *e;
  int rc = MBD_OK;
  while (!rc && (e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".pub")) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    rc = add_file(k, role, p, err);
  }
  closedir(d);
  return rc;
}

int mbd_zap_keys_add(mbd_zap_keys *k, mbd_zap_role role, const char *spec, mbd_error *err) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", spec);
  int rc = MBD_OK;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); !rc && t; t = strtok_r(NULL, ",", &save)) {
    struct stat st;
    if (mbd_curve_key_valid(t)) rc = add_one(k, role, t, "key list", err);
    else if (stat(t, &st) == 0 && S_ISDIR(st.st_mode)) rc = add_dir(k, role, t, err);
    else rc = add_file(k, role, t, err);
  }
  return rc;
}

size_t mbd_zap_keys_count(const mbd_zap_keys *k, mbd_zap_role role) { return k->n[role]; }

static bool has_key(const mbd_zap_keys *k, mbd_zap_role role, const char *z85) {
  return k->n[role] && bsearch(z85, k->keys[role], k->n[role], sizeof *k->keys[role], cmp_key);
}

static bool frame_is(const uint8_t *d, size_t n, const char *s) {
  return n == strlen(s) && !memcmp(d, s, n);
}

static void verdict(mbd_zap_verdict *v, const char *status, const char *text) {
  snprintf(v->status, sizeof v->status, "%s", status);
  snprintf(v->text, sizeof v->text, "%s", text);
  v->ok = !strcmp(status, "200");
}

void mbd_zap_decide(const mbd_zap_keys *k, const uint8_t *const *data, const size_t *len, size_t n,
                    mbd_zap_verdict *v) {
  memset(v, 0, sizeof *v);
  if (n < 6 || !frame_is(data[0], len[0], "1.0")) {
    verdict(v, "500", "malformed ZAP request");
    return;
  }
  mbd_zap_role role;
  if (frame_is(data[2], len[2], "clients")) role = MBD_ZAP_CLIENTS;
  else if (frame_is(data[2], len[2], "workers")) role = MBD_ZAP_WORKERS;
  else {
    verdict(v, "400", "unknown ZAP domain");
    return;
  }
  snprintf(v->domain, sizeof v->domain, "%s", role == MBD_ZAP_CLIENTS ? "clients" : "workers");
  if (!frame_is(data[5], len[5], "CURVE")) {
    verdict(v, "400", "only CURVE is accepted");
    return;
  }
  if (n != 7 || len[6] != 32) {
    verdict(v, "500", "CURVE credentials must be one 32-byte key");
    return;
  }
  char z85[MBD_CURVE_KEY_LEN + 1];
  if (!zmq_z85_encode(z85, data[6], 32)) {
    verdict(v, "500", "cannot encode the key");
    return;
  }
  memcpy(v->key, z85, sizeof z85);
  bool op = role == MBD_ZAP_CLIENTS && has_key(k, MBD_ZAP_OPERATORS, z85);
  if (!op && !has_key(k, role, z85)) {
    verdict(v, "400", "key not admitted");
    return;
  }
  verdict(v, "200", "OK");
  snprintf(v->user_id, sizeof v->user_id, "%s:%s", op ? "op" : "key", z85);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void mbd_zap_serve(void *zap, mbd_zap_keys *k) {
  for (;;) {
    zmq_msg_t fr[ZAP_MAX_FRAMES];
    size_t n = 0;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        for (size_t i = 0; i < n; i++) zmq_msg_close(&fr[i]);
        return; /* nothing queued (or the context is ending) */
      }
      more = zmq_msg_more(&m);
      if (n < ZAP_MAX_FRAMES) fr[n++] = m;
      else zmq_msg_close(&m);
    }
    const uint8_t *data[ZAP_MAX_FRAMES];
    size_t len[ZAP_MAX_FRAMES];
    for (size_t i = 0; i < n; i++) {
      data[i] = zmq_msg_data(&fr[i]);
      len[i] = zmq_msg_size(&fr[i]);
    }
    mbd_zap_verdict v;
    mbd_zap_decide(k, data, len, n, &v);
    int64_t t = now_ms();
    bool again = !v.ok && !strcmp(v.key, k->last_key) && t - k->last_ms < 10000;
    if (again) k->quiet++;
    if (!v.ok && !again) {
      snprintf(k->last_key, sizeof k->last_key, "%s", v.key);
      k->last_ms = t;
      if (k->quiet) MBD_LOGW(LOG, "(%llu more rejections of the previous key)", (unsigned long long)k->quiet);
      k->quiet = 0;
      char addr[64] = "?";
      if (n > 3) snprintf(addr, sizeof addr, "%.*s", (int)(len[3] < 60 ? len[3] : 60), (const char *)data[3]);
      MBD_LOGW(LOG, "rejected %s connection from %s: %s (key %s)", v.domain[0] ? v.domain : "?", addr,
               v.text, v.key[0] ? v.key : "none");
    }
    /* Reply: version, request id, status code, status text, user id, metadata. */
    const char *ver = "1.0";
    zmq_send(zap, ver, 3, ZMQ_SNDMORE);
    if (n > 1) zmq_send(zap, data[1], len[1], ZMQ_SNDMORE);
    else zmq_send(zap, "", 0, ZMQ_SNDMORE);
    zmq_send(zap, v.status, 3, ZMQ_SNDMORE);
    zmq_send(zap, v.text, strlen(v.text), ZMQ_SNDMORE);
    zmq_send(zap, v.user_id, strlen(v.user_id), ZMQ_SNDMORE);
    zmq_send(zap, "", 0, 0);
    for (size_t i = 0; i < n; i++) zmq_msg_close(&fr[i]);
  }
}
