/* Wire messages: the frames of common/protocol.h held as zmq_msg_t so payloads
 * travel without copies (by reference on send, by move when forwarding, by
 * reference count when cloned), and strict validation of every received
 * message before its content is trusted. */
#include "common/wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/protocol.h"

#define PEER_MAX 255 /* ZeroMQ routing ids are at most 255 bytes */

struct mbd_msg {
  uint8_t cmd;
  uint64_t tag;
  zmq_msg_t body;          /* F1; empty reads as an empty map */
  zmq_msg_t *pl;           /* payloads F2.. */
  size_t npl, cap;         /* used / allocated payload slots */
  uint8_t peer[PEER_MAX];  /* routing id (ROUTER sockets) */
  size_t peer_len;         /* 0 = none */
};

int mbd_msg_new(uint8_t cmd, uint64_t tag, mbd_msg **out, mbd_error *err) {
  *out = NULL;
  mbd_msg *m = calloc(1, sizeof *m);
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "out of memory allocating a message");
  m->cmd = cmd;
  m->tag = tag;
  zmq_msg_init(&m->body);
  *out = m;
  return MBD_OK;
}

void mbd_msg_destroy(mbd_msg **pm) {
  if (!pm || !*pm) return;
  mbd_msg *m = *pm;
  zmq_msg_close(&m->body);
  for (size_t i = 0; i < m->npl; i++) zmq_msg_close(&m->pl[i]);
  free(m->pl);
  free(m);
  *pm = NULL;
}

uint8_t mbd_msg_cmd(const mbd_msg *m) { return m->cmd; }
void mbd_msg_set_cmd(mbd_msg *m, uint8_t cmd) { m->cmd = cmd; }
uint64_t mbd_msg_tag(const mbd_msg *m) { return m->tag; }
void mbd_msg_set_tag(mbd_msg *m, uint64_t tag) { m->tag = tag; }

int mbd_msg_set_body(mbd_msg *m, const void *data, size_t len, mbd_error *err) {
  zmq_msg_t b;
  if (zmq_msg_init_size(&b, len))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte body", len);
  if (len) memcpy(zmq_msg_data(&b), data, len);
  zmq_msg_close(&m->body);
  zmq_msg_init(&m->body);
  zmq_msg_move(&m->body, &b);
  zmq_msg_close(&b);
  return MBD_OK;
}

static void free_cb(void *data, void *hint) {
  (void)hint;
  free(data);
}

int mbd_msg_take_body(mbd_msg *m, msgpack_sbuffer *sb, mbd_error *err) {
  if (!sb->data || !sb->size) {
    int rc = mbd_msg_set_body(m, NULL, 0, err);
    msgpack_sbuffer_destroy(sb);
    sb->data = NULL;
    sb->size = sb->alloc = 0;
    return rc;
  }
  zmq_msg_t b;
  /* msgpack_sbuffer allocates with malloc/realloc, so free() releases it. */
  if (zmq_msg_init_data(&b, sb->data, sb->size, free_cb, NULL))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory wrapping a %zu-byte body", sb->size);
  sb->data = NULL;
  sb->size = sb->alloc = 0;
  zmq_msg_close(&m->body);
  zmq_msg_init(&m->body);
  zmq_msg_move(&m->body, &b);
  zmq_msg_close(&b);
  return MBD_OK;
}

const char *mbd_msg_gets(const mbd_msg *m, const char *property) {
  return zmq_msg_gets(&m->body, property);
}

const void *mbd_msg_body(const mbd_msg *m, size_t *len) {
  zmq_msg_t *b = (zmq_msg_t *)&m->body; /* zmq_msg_size/data take non-const */
  *len = zmq_msg_size(b);
  return zmq_msg_data(b);
}

/* Appends an initialised empty slot; returns it or NULL. */
static zmq_msg_t *slot(mbd_msg *m, mbd_error *err) {
  if (m->npl >= MBD_MSG_MAX_FRAMES) {
    mbd_error_set(err, MBD_E_TOO_LARGE, "message already has %d payload frames", MBD_MSG_MAX_FRAMES);
    return NULL;
  }
  if (m->npl == m->cap) {
    size_t nc = m->cap ? 2 * m->cap : 4;
    zmq_msg_t *np = malloc(nc * sizeof *np);
    if (!np) {
      mbd_error_set(err, MBD_E_NOMEM, "out of memory adding a payload frame");
      return NULL;
    }
    /* zmq_msg_t may not be relocated by memcpy: move each one. */
    for (size_t i = 0; i < m->npl; i++) {
      zmq_msg_init(&np[i]);
      zmq_msg_move(&np[i], &m->pl[i]);
      zmq_msg_close(&m->pl[i]);
    }
    free(m->pl);
    m->pl = np;
    m->cap = nc;
  }
  zmq_msg_t *s = &m->pl[m->npl];
  zmq_msg_init(s);
  return s;
}

int mbd_msg_add_payload_copy(mbd_msg *m, const void *data, size_t len, mbd_error *err) {
  zmq_msg_t *s = slot(m, err);
  if (!s) return err ? err->code : MBD_E_NOMEM;
  zmq_msg_close(s);
  if (zmq_msg_init_size(s, len)) {
    zmq_msg_init(s);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte payload", len);
  }
  if (len) memcpy(zmq_msg_data(s), data, len);
  m->npl++;
  return MBD_OK;
}

int mbd_msg_add_payload_ref(mbd_msg *m, void *data, size_t len, zmq_free_fn *ffn, void *hint,
                            mbd_error *err) {
  zmq_msg_t *s = slot(m, err);
  if (!s) return err ? err->code : MBD_E_NOMEM;
  zmq_msg_close(s);
  if (zmq_msg_init_data(s, data, len, ffn, hint)) {
    zmq_msg_init(s);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory referencing a %zu-byte payload", len);
  }
  m->npl++;
  return MBD_OK;
}

int mbd_msg_add_payload_move(mbd_msg *m, zmq_msg_t *src, mbd_error *err) {
  zmq_msg_t *s = slot(m, err);
  if (!s) return err ? err->code : MBD_E_NOMEM;
  zmq_msg_move(s, src);
  m->npl++;
  return MBD_OK;
}

size_t mbd_msg_npayloads(const mbd_msg *m) { return m->npl; }

const void *mbd_msg_payload(const mbd_msg *m, size_t i, size_t *len) {
  if (i >= m->npl) {
    *len = 0;
    return NULL;
  }
  *len = zmq_msg_size(&m->pl[i]);
  return zmq_msg_data(&m->pl[i]);
}

int mbd_msg_take_payload(mbd_msg *m, size_t i, zmq_msg_t *dst, mbd_error *err) {
  if (i >= m->npl)
    return mbd_error_set(err, MBD_E_INVALID, "payload %zu does not exist (message has %zu)", i, m->npl);
  zmq_msg_init(dst);
  zmq_msg_move(dst, &m->pl[i]);
  return MBD_OK;
}

int mbd_msg_set_peer(mbd_msg *m, const void *id, size_t len, mbd_error *err) {
  if (len > PEER_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "peer identity of %zu bytes (at most %d)", len, PEER_MAX);
  if (len) memcpy(m->peer, id, len);
  m->peer_len = len;
  return MBD_OK;
}

const void *mbd_msg_peer(const mbd_msg *m, size_t *len) {
  *len = m->peer_len;
  return m->peer_len ? m->peer : NULL;
}

int mbd_msg_clone(mbd_msg *m, mbd_msg **out, mbd_error *err) {
  mbd_msg *c = NULL;
  int rc = mbd_msg_new(m->cmd, m->tag, &c, err);
  if (rc) return rc;
  memcpy(c->peer, m->peer, m->peer_len);
  c->peer_len = m->peer_len;
  if (zmq_msg_copy(&c->body, &m->body)) {
    rc = mbd_error_set(err, MBD_E_INTERNAL, "cloning a body: %s", zmq_strerror(errno));
    goto fail;
  }
  for (size_t i = 0; i < m->npl; i++) {
    zmq_msg_t *s = slot(c, err);
    if (!s) {
      rc = err ? err->code : MBD_E_NOMEM;
      goto fail;
    }
    if (zmq_msg_copy(s, &m->pl[i])) {
      rc = mbd_error_set(err, MBD_E_INTERNAL, "cloning payload %zu: %s", i, zmq_strerror(errno));
      goto fail;
    }
    c->npl++;
  }
  *out = c;
  return MBD_OK;
fail:
  mbd_msg_destroy(&c);
  return rc;
}

static int sock_error(int e, const char *what, mbd_error *err) {
  if (e == EHOSTUNREACH)
    return mbd_error_set(err, MBD_E_NOT_FOUND, "%s: peer is not connected", what);
  if (e == EAGAIN)
    return mbd_error_set(err, MBD_E_BUSY, "%s: peer's queue is full (high-water mark)", what);
  return mbd_error_set(err, MBD_E_IO, "%s: %s", what, zmq_strerror(e));
}

int mbd_msg_send(mbd_msg **pm, void *socket, int flags, mbd_error *err) {
  mbd_msg *m = *pm;
  *pm = NULL;
  if (!m) return mbd_error_set(err, MBD_E_INVALID, "sending a NULL message");
  int rc = MBD_OK;
  int more = ZMQ_SNDMORE | flags;
  uint8_t hdr[MBD_PROTO_HEADER_BYTES] = {'M', 'B', 'D', MBD_PROTO_VERSION, m->cmd};
  for (int i = 0; i < 8; i++) hdr[5 + i] = (uint8_t)(m->tag >> (8 * i));
  /* After the first frame is accepted ZeroMQ queues the rest atomically. */
  if ((m->peer_len && zmq_send(socket, m->peer, m->peer_len, more) < 0) ||
      zmq_send(socket, hdr, sizeof hdr, more) < 0 ||
      zmq_msg_send(&m->body, socket, m->npl ? more : flags) < 0) {
    rc = sock_error(errno, "sending a message", err);
    goto done;
  }
  for (size_t i = 0; i < m->npl; i++) {
    if (zmq_msg_send(&m->pl[i], socket, i + 1 < m->npl ? more : flags) < 0) {
      rc = sock_error(errno, "sending a payload frame", err);
      goto done;
    }
  }
done:
  mbd_msg_destroy(&m);
  return rc;
}

/* Builds *out from received frames (consumed). nseen/total describe the whole
 * message as it arrived, including frames the receiver already dropped. */
static int assemble(zmq_msg_t *fr, size_t n, size_t nseen, size_t total, bool router,
                    size_t max_bytes, mbd_msg **out, mbd_error *err) {
  mbd_msg *m = NULL;
  int rc = mbd_msg_new(0, 0, &m, err);
  if (rc) goto done;
  size_t b = router ? 1 : 0;
  if (router && n >= 1) {
    size_t pl = zmq_msg_size(&fr[0]);
    m->peer_len = pl > PEER_MAX ? PEER_MAX : pl;
    memcpy(m->peer, zmq_msg_data(&fr[0]), m->peer_len);
  }
  /* Tag and command first, whatever else is wrong, so an ERROR can name the request. */
  if (n > b && zmq_msg_size(&fr[b]) == MBD_PROTO_HEADER_BYTES) {
    const uint8_t *h = zmq_msg_data(&fr[b]);
    m->cmd = h[4];
    for (int i = 7; i >= 0; i--) m->tag = (m->tag << 8) | h[5 + i];
  }

  if (n <= b) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL, "empty message");
    goto done;
  }
  const uint8_t *h = zmq_msg_data(&fr[b]);
  size_t hl = zmq_msg_size(&fr[b]);
  if (hl < 4 || memcmp(h, MBD_PROTO_MAGIC, 3)) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL,
                       "bad magic: the first frame must be 'MBD', the version byte, the command "
                       "and the tag");
    goto done;
  }
  if (h[3] != MBD_PROTO_VERSION) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL,
                       "protocol version %u not supported (this build speaks %d: upgrade the "
                       "peer so both ends run the same mambad release)",
                       h[3], MBD_PROTO_VERSION);
    goto done;
  }
  if (hl != MBD_PROTO_HEADER_BYTES) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL,
                       "header frame has %zu bytes; expected %d (magic, version, command, tag)", hl,
                       MBD_PROTO_HEADER_BYTES);
    goto done;
  }
  if (nseen < b + 2) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL,
                       "message has %zu frame(s); expected at least 2 (header, body)", nseen - b);
    goto done;
  }
  if (!strcmp(mbd_cmd_name(m->cmd), "unknown")) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL, "unknown command 0x%02x", m->cmd);
    goto done;
  }
  if (max_bytes && total > max_bytes) {
    rc = mbd_error_set(err, MBD_E_TOO_LARGE, "message of %zu bytes exceeds the limit of %zu bytes",
                       total, max_bytes);
    goto done;
  }
  if (nseen - b - 2 > MBD_MSG_MAX_FRAMES) {
    rc = mbd_error_set(err, MBD_E_TOO_LARGE, "message has %zu payload frames (at most %d)",
                       nseen - b - 2, MBD_MSG_MAX_FRAMES);
    goto done;
  }
  rc = mbd_body_check(zmq_msg_data(&fr[b + 1]), zmq_msg_size(&fr[b + 1]), err);
  if (rc) goto done;
  zmq_msg_move(&m->body, &fr[b + 1]);
  for (size_t i = b + 2; i < n; i++) {
    rc = mbd_msg_add_payload_move(m, &fr[i], err);
    if (rc) goto done;
  }
done:
  for (size_t i = 0; i < n; i++) zmq_msg_close(&fr[i]);
  if (rc && rc != MBD_E_PROTOCOL && rc != MBD_E_TOO_LARGE && rc != MBD_E_FORMAT) {
    mbd_msg_destroy(&m); /* NOMEM: nothing usable */
  } else if (m) {
    if (rc) { /* malformed: keep only peer, command and tag */
      zmq_msg_close(&m->body);
      zmq_msg_init(&m->body);
      for (size_t i = 0; i < m->npl; i++) zmq_msg_close(&m->pl[i]);
      m->npl = 0;
    }
  }
  *out = m;
  return rc;
}

int mbd_msg_decode(zmq_msg_t *frames, size_t n, bool router, size_t max_bytes, mbd_msg **out,
                   mbd_error *err) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += zmq_msg_size(&frames[i]);
  size_t keep = n;
  size_t limit = (router ? 1u : 0u) + 2u + MBD_MSG_MAX_FRAMES;
  if (keep > limit) {
    for (size_t i = limit; i < n; i++) zmq_msg_close(&frames[i]);
    keep = limit;
  }
  return assemble(frames, keep, n, total, router, max_bytes, out, err);
}

int mbd_msg_recv(void *socket, bool router, size_t max_bytes, mbd_msg **out, mbd_error *err) {
  *out = NULL;
  size_t hdr = (router ? 1u : 0u) + 2u;
  size_t limit = hdr + MBD_MSG_MAX_FRAMES;
  zmq_msg_t *fr = NULL;
  size_t n = 0, cap = 0, nseen = 0, total = 0;
  int more = 1, rc = MBD_OK;
  bool nomem = false;
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    int r;
    do {
      r = zmq_msg_recv(&part, socket, 0);
      /* Later parts of a multipart message are already queued: retry EINTR. */
    } while (r < 0 && errno == EINTR && nseen > 0);
    if (r < 0) {
      int e = errno;
      zmq_msg_close(&part);
      rc = mbd_error_set(err, MBD_E_IO, "receiving: %s", zmq_strerror(e));
      goto fail;
    }
    more = zmq_msg_more(&part);
    nseen++;
    total += zmq_msg_size(&part);
    /* Header frames are always kept (identity, tag); payloads only while
     * under the cap and the frame limit: the rest is drained and dropped. */
    bool keep = nseen <= hdr || ((!max_bytes || total <= max_bytes) && nseen <= limit);
    if (keep && n == cap) {
      size_t nc = cap ? 2 * cap : 8;
      zmq_msg_t *np = malloc(nc * sizeof *np);
      if (!np) {
        nomem = true;
        keep = false;
      } else {
        for (size_t i = 0; i < n; i++) {
          zmq_msg_init(&np[i]);
          zmq_msg_move(&np[i], &fr[i]);
          zmq_msg_close(&fr[i]);
        }
        free(fr);
        fr = np;
        cap = nc;
      }
    }
    if (keep) {
      zmq_msg_init(&fr[n]);
      zmq_msg_move(&fr[n], &part);
      n++;
    }
    zmq_msg_close(&part);
  }
  if (nomem) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory receiving a %zu-frame message", nseen);
    goto fail;
  }
  rc = assemble(fr, n, nseen, total, router, max_bytes, out, err);
  free(fr);
  return rc;
fail:
  for (size_t i = 0; i < n; i++) zmq_msg_close(&fr[i]);
  free(fr);
  return rc;
}

/* A new message of cmd/tag that takes the body packed in sb (destroyed). */
static int new_with_body(uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb, mbd_msg **out,
                         mbd_error *err) {
  mbd_msg *m = NULL;
  int rc = mbd_msg_new(cmd, tag, &m, err);
  if (!rc) rc = mbd_msg_take_body(m, sb, err);
  msgpack_sbuffer_destroy(sb);
  if (rc) {
    mbd_msg_destroy(&m);
    return rc;
  }
  *out = m;
  return MBD_OK;
}

int mbd_msg_new_error(uint64_t tag, int code, const char *message, mbd_msg **out, mbd_error *err) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  mbd_pack_kv_i64(&pk, "code", code);
  mbd_pack_kv_str(&pk, "error", mbd_status_name(code));
  mbd_pack_kv_str(&pk, "message", message ? message : "");
  return new_with_body(MBD_CMD_ERROR, tag, &sb, out, err);
}

int mbd_msg_new_kv(uint8_t cmd, uint64_t tag, const char *key, const char *value, mbd_msg **out,
                   mbd_error *err) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, key, value ? value : "");
  return new_with_body(cmd, tag, &sb, out, err);
}
