/* Route identity: names, canonical encoding, id, matching. */
#include "common/route.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/sha256.h"

static const char *const k_modes[] = {"deterministic", "cublas-fast", "cublas-pedantic"};
static const char *const k_policies[] = {"f32", "tf32", "bf16", "f16"};
static const char *const k_families[] = {"inference", "triad"};
static const char *const k_backends[] = {"cpu", "cuda"};
static const char *const k_decode_paths[] = {"per-op", "persistent"};
static const char *const k_state_dtypes[] = {"f32", "bf16"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *name_of(const char *const *names, size_t n, int v) {
  return (v >= 0 && (size_t)v < n) ? names[v] : "?";
}

/* Looks s up in names; on failure the error lists every valid value. */
static int parse_name(const char *what, const char *const *names, size_t n, const char *s, int *out,
                      mbd_error *err) {
  for (size_t i = 0; s && i < n; i++) {
    if (!strcmp(s, names[i])) {
      *out = (int)i;
      return MBD_OK;
    }
  }
  char valid[128] = "";
  size_t used = 0;
  for (size_t i = 0; i < n; i++) {
    int w = snprintf(valid + used, sizeof valid - used, "%s%s", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= sizeof valid - used) break;
    used += (size_t)w;
  }
  /* Print the bad value escaped so non-UTF-8 bytes never reach a terminal raw. */
  char shown[64] = "(null)";
  if (s) {
    size_t j = 0;
    for (size_t i = 0; s[i] && j + 5 < sizeof shown; i++) {
      unsigned char c = (unsigned char)s[i];
      if (c >= 0x20 && c < 0x7f) shown[j++] = (char)c;
      else j += (size_t)snprintf(shown + j, sizeof shown - j, "\\x%02x", c);
    }
    shown[j] = '\0';
  }
  return mbd_error_set(err, MBD_E_INVALID, "invalid %s '%s' (valid: %s)", what, shown, valid);
}

const char *mbd_gemm_mode_name(mbd_gemm_mode m) { return name_of(k_modes, COUNT(k_modes), (int)m); }
const char *mbd_dtype_policy_name(mbd_dtype_policy p) {
  return name_of(k_policies, COUNT(k_policies), (int)p);
}
const char *mbd_family_name(mbd_family f) { return name_of(k_families, COUNT(k_families), (int)f); }
const char *mbd_backend_name(mbd_backend_kind b) {
  return name_of(k_backends, COUNT(k_backends), (int)b);
}
const char *mbd_decode_path_name(mbd_decode_path d) {
  return name_of(k_decode_paths, COUNT(k_decode_paths), (int)d);
}

const char *mbd_state_dtype_name(mbd_state_dtype d) {
  return name_of(k_state_dtypes, COUNT(k_state_dtypes), (int)d);
}

const char *mbd_state_dtype_where(mbd_state_dtype d) {
  return d == MBD_STATE_F32 ? "every family and backend" : "Mamba-1 and Mamba-2 on CUDA only";
}

int mbd_gemm_mode_parse(const char *s, mbd_gemm_mode *out, mbd_error *err) {
  int v = 0, rc = parse_name("GEMM mode", k_modes, COUNT(k_modes), s, &v, err);
  if (!rc) *out = (mbd_gemm_mode)v;
  return rc;
}
int mbd_gemm_mode_resolve(const char *flag, mbd_gemm_mode *out, mbd_error *err) {
  const char *env = getenv("MBD_GEMM_MODE");
  const char *v = flag ? flag : env && *env ? env : NULL;
  *out = MBD_GEMM_DETERMINISTIC;
  if (!v) return MBD_OK;
  int rc = mbd_gemm_mode_parse(v, out, err);
  if (rc) return mbd_error_prefix(err, flag ? "--gemm-mode" : "MBD_GEMM_MODE (environment)");
  return MBD_OK;
}

int mbd_dtype_policy_parse(const char *s, mbd_dtype_policy *out, mbd_error *err) {
  int v = 0, rc = parse_name("dtype", k_policies, COUNT(k_policies), s, &v, err);
  if (!rc) *out = (mbd_dtype_policy)v;
  return rc;
}
int mbd_family_parse(const char *s, mbd_family *out, mbd_error *err) {
  int v = 0, rc = parse_name("family", k_families, COUNT(k_families), s, &v, err);
  if (!rc) *out = (mbd_family)v;
  return rc;
}
int mbd_backend_parse(const char *s, mbd_backend_kind *out, mbd_error *err) {
  int v = 0, rc = parse_name("backend", k_backends, COUNT(k_backends), s, &v, err);
  if (!rc) *out = (mbd_backend_kind)v;
  return rc;
}
int mbd_decode_path_parse(const char *s, mbd_decode_path *out, mbd_error *err) {
  int v = 0, rc = parse_name("decode path", k_decode_paths, COUNT(k_decode_paths), s, &v, err);
  if (!rc) *out = (mbd_decode_path)v;
  return rc;
}

int mbd_state_dtype_parse(const char *s, mbd_state_dtype *out, mbd_error *err) {
  int v = 0, rc = parse_name("state dtype", k_state_dtypes, COUNT(k_state_dtypes), s, &v, err);
  if (!rc) *out = (mbd_state_dtype)v;
  return rc;
}

/* A value is one line of text: control characters become spaces. */
static void clean_copy(char *dst, size_t cap, const char *src) {
  size_t i = 0;
  for (; src[i] && i + 1 < cap; i++) {
    unsigned char c = (unsigned char)src[i];
    dst[i] = c < 0x20 || c == 0x7f ? ' ' : src[i];
  }
  dst[i] = '\0';
}

int mbd_route_encode(const mbd_route_identity *r, char *buf, size_t cap, size_t *len,
                     mbd_error *err) {
  char isa[sizeof r->isa], dig[sizeof r->kernel_digest], comp[sizeof r->compiler],
      dev[sizeof r->device_name], libs[sizeof r->libraries];
  clean_copy(isa, sizeof isa, r->isa);
  clean_copy(dig, sizeof dig, r->kernel_digest);
  clean_copy(comp, sizeof comp, r->compiler);
  clean_copy(dev, sizeof dev, r->device_name);
  clean_copy(libs, sizeof libs, r->libraries);
  int n = snprintf(buf, cap,
                   "mambad-route/%d\n"
                   "backend=%s\nmode=%s\ndtype=%s\nstate=%s\nfamily=%s\nisa=%s\nkernels=%s\n"
                   "compiler=%s\ndevice=%s\ncc=%d.%d\nsms=%d\nlibraries=%s\ndispatch=%d\n"
                   "decode=%s\nstate_capacity=%" PRId64 "\n",
                   MBD_ROUTE_FORMAT_VERSION, mbd_backend_name(r->backend), mbd_gemm_mode_name(r->mode),
                   mbd_dtype_policy_name(r->policy), mbd_state_dtype_name(r->state),
                   mbd_family_name(r->family), isa, dig, comp, dev,
                   r->cc_major, r->cc_minor, r->sm_count, libs, r->dispatch_rev,
                   mbd_decode_path_name(r->decode), r->state_capacity);
  if (n < 0 || (size_t)n >= cap)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "route encoding needs %d bytes, buffer has %zu", n,
                         cap);
  if (len) *len = (size_t)n;
  return MBD_OK;
}

/* Copies the value for `key` (line "key=value") from text into dst. */
static int field(const char *text, const char *key, char *dst, size_t cap) {
  size_t kl = strlen(key);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    size_t ll = eol ? (size_t)(eol - p) : strlen(p);
    if (ll > kl && !strncmp(p, key, kl) && p[kl] == '=') {
      size_t vl = ll - kl - 1;
      if (vl >= cap) return -1;
      memcpy(dst, p + kl + 1, vl);
      dst[vl] = '\0';
      return 0;
    }
    p = eol ? eol + 1 : NULL;
  }
  return -1;
}

static int missing(mbd_error *err, const char *key) {
  return mbd_error_set(err, MBD_E_FORMAT, "route encoding: no '%s=' line", key);
}

/* A bad enum value inside an encoding is a format error, with the parser's
 * message (which names the valid values) kept. */
static int as_format(mbd_error *err) {
  if (err) {
    mbd_error_prefix(err, "route encoding");
    err->code = MBD_E_FORMAT;
  }
  return MBD_E_FORMAT;
}

int mbd_route_decode(const char *buf, size_t len, mbd_route_identity *out, mbd_error *err) {
  char text[1024];
  if (!buf) return mbd_error_set(err, MBD_E_FORMAT, "route encoding is empty");
  if (len >= sizeof text) return mbd_error_set(err, MBD_E_FORMAT, "route encoding too long (%zu)", len);
  memcpy(text, buf, len);
  text[len] = '\0';
  char hdr[32];
  snprintf(hdr, sizeof hdr, "mambad-route/%d\n", MBD_ROUTE_FORMAT_VERSION);
  if (strncmp(text, hdr, strlen(hdr)))
    return mbd_error_set(err, MBD_E_FORMAT, "route encoding lacks header '%.*s'",
                         (int)strlen(hdr) - 1, hdr);
  memset(out, 0, sizeof *out);
  char v[128];
  int m = 0, p = 0, f = 0, b = 0, d = 0, sd = 0;
  /* Enum fields: keep the parser's message (it lists the valid values). */
  if (field(text, "backend", v, sizeof v)) return missing(err, "backend");
  if (mbd_backend_parse(v, (mbd_backend_kind *)&b, err)) return as_format(err);
  if (field(text, "mode", v, sizeof v)) return missing(err, "mode");
  if (mbd_gemm_mode_parse(v, (mbd_gemm_mode *)&m, err)) return as_format(err);
  if (field(text, "dtype", v, sizeof v)) return missing(err, "dtype");
  if (mbd_dtype_policy_parse(v, (mbd_dtype_policy *)&p, err)) return as_format(err);
  if (field(text, "state", v, sizeof v)) return missing(err, "state");
  if (mbd_state_dtype_parse(v, (mbd_state_dtype *)&sd, err)) return as_format(err);
  if (field(text, "family", v, sizeof v)) return missing(err, "family");
  if (mbd_family_parse(v, (mbd_family *)&f, err)) return as_format(err);
  if (field(text, "decode", v, sizeof v)) return missing(err, "decode");
  if (mbd_decode_path_parse(v, (mbd_decode_path *)&d, err)) return as_format(err);
  out->backend = (mbd_backend_kind)b;
  out->mode = (mbd_gemm_mode)m;
  out->policy = (mbd_dtype_policy)p;
  out->state = (mbd_state_dtype)sd;
  out->family = (mbd_family)f;
  out->decode = (mbd_decode_path)d;
  if (field(text, "isa", out->isa, sizeof out->isa) ||
      field(text, "kernels", out->kernel_digest, sizeof out->kernel_digest) ||
      field(text, "compiler", out->compiler, sizeof out->compiler) ||
      field(text, "device", out->device_name, sizeof out->device_name) ||
      field(text, "libraries", out->libraries, sizeof out->libraries))
    return mbd_error_set(err, MBD_E_FORMAT, "route encoding: missing or oversized text field");
  /* The encoder writes no control characters, so an identity holding one
   * would not be the identity its route id (of the re-encoding) names. */
  const char *texts[] = {out->isa, out->kernel_digest, out->compiler, out->device_name,
                         out->libraries};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    for (const char *c = texts[i]; *c; c++)
      if ((unsigned char)*c < 0x20 || *c == 0x7f)
        return mbd_error_set(err, MBD_E_FORMAT,
                             "route encoding: control character 0x%02x in a text field",
                             (unsigned char)*c);
  if (field(text, "cc", v, sizeof v) || sscanf(v, "%d.%d", &out->cc_major, &out->cc_minor) != 2 ||
      field(text, "sms", v, sizeof v) || sscanf(v, "%d", &out->sm_count) != 1 ||
      field(text, "dispatch", v, sizeof v) || sscanf(v, "%d", &out->dispatch_rev) != 1 ||
      field(text, "state_capacity", v, sizeof v) ||
      sscanf(v, "%" SCNd64, &out->state_capacity) != 1)
    return mbd_error_set(err, MBD_E_FORMAT, "route encoding: bad numeric field");
  return MBD_OK;
}

void mbd_route_id_hex(const mbd_route_identity *r, char out[65]) {
  char buf[1024];
  size_t len = 0;
  if (mbd_route_encode(r, buf, sizeof buf, &len, NULL)) len = 0; /* cannot happen: 1 KiB fits */
  uint8_t d[32];
  mbd_sha256(buf, len, d);
  mbd_sha256_hex(d, out);
}

bool mbd_route_matches(const mbd_route_want *w, const mbd_route_identity *r, const char *id) {
  /* An id constraint is the full id or a prefix of at least 8 hex digits
   * (case-insensitive); anything shorter would match workers by accident. */
  size_t idl = strnlen(w->route_id, sizeof w->route_id);
  if (idl && (idl < 8 || !id || strncasecmp(w->route_id, id, idl))) return false;
  if (w->backend[0] && strcmp(w->backend, mbd_backend_name(r->backend))) return false;
  if (w->gemm_mode[0] && strcmp(w->gemm_mode, mbd_gemm_mode_name(r->mode))) return false;
  if (w->dtype[0] && strcmp(w->dtype, mbd_dtype_policy_name(r->policy))) return false;
  if (w->state[0] && strcmp(w->state, mbd_state_dtype_name(r->state))) return false;
  if (w->family[0] && strcmp(w->family, mbd_family_name(r->family))) return false;
  if (w->device_name[0] && strcmp(w->device_name, r->device_name)) return false;
  return true;
}

void mbd_route_want_format(const mbd_route_want *w, char *buf, size_t cap) {
  size_t n = 0;
  if (!cap) return;
  buf[0] = '\0';
#define ADD(k, v)                                                                \
  if ((v)[0] && n < cap) {                                                       \
    int x = snprintf(buf + n, cap - n, "%s%s=%s", n ? " " : "", k, v);           \
    if (x > 0) n += (size_t)x;                                                   \
  }
  ADD("route_id", w->route_id);
  ADD("backend", w->backend);
  ADD("gemm_mode", w->gemm_mode);
  ADD("dtype", w->dtype);
  ADD("state", w->state);
  ADD("family", w->family);
  ADD("device", w->device_name);
#undef ADD
  if (!n) snprintf(buf, cap, "any");
}
