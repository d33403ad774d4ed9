/* Deployment YAML reader: libyaml's document loader builds the node tree,
 * then a strict walker copies known keys into mbd_deploy_config. Every error
 * carries "file:line: field:" so a person can go straight to the mistake. The
 * walker only descends where the schema says a container is, so anchors and
 * aliases cannot make it do more work than the plain text would. */
#include "common/deploy_config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/defaults.h"
#include "common/protocol.h"
#include "common/route.h"

#define MAX_MAP_KEYS 64

typedef struct walker {
  yaml_document_t *doc;
  const char *label; /* file name for messages */
  mbd_error *err;
} walker;

/* Records "label:line: field: message" as MBD_E_INVALID (or code). */
__attribute__((format(printf, 5, 6))) static int failf(walker *w, int code, const yaml_node_t *n,
                                                       const char *field, const char *fmt, ...) {
  char msg[MBD_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mbd_error_set(w->err, code, "%s:%d: %s: %s", w->label, n ? (int)n->start_mark.line + 1 : 1,
                       field, msg);
}

static yaml_node_t *node_at(walker *w, int idx) { return yaml_document_get_node(w->doc, idx); }

static int want_kind(walker *w, const yaml_node_t *n, yaml_node_type_t t, const char *field) {
  if (n && n->type == t) return 0;
  const char *what = t == YAML_MAPPING_NODE ? "a mapping (key: value lines)"
                     : t == YAML_SEQUENCE_NODE ? "a list ([a, b] or '- ' items)"
                                               : "a single value";
  return failf(w, MBD_E_INVALID, n, field, "must be %s", what);
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int get_str(walker *w, const yaml_node_t *n, const char *field, char *dst, size_t cap) {
  int rc = want_kind(w, n, YAML_SCALAR_NODE, field);
  if (rc) return rc;
  size_t len = n->data.scalar.length;
  if (len == 0) return failf(w, MBD_E_INVALID, n, field, "is empty");
  if (len >= cap || strlen(scalar(n)) != len)
    return failf(w, MBD_E_INVALID, n, field, "must be text of at most %zu bytes", cap - 1);
  memcpy(dst, scalar(n), len + 1);
  return 0;
}

static int get_int(walker *w, const yaml_node_t *n, const char *field, int64_t lo, int64_t hi,
                   int64_t *out) {
  int rc = want_kind(w, n, YAML_SCALAR_NODE, field);
  if (rc) return rc;
  const char *s = scalar(n);
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || errno || !end || *end || strlen(s) != n->data.scalar.length)
    return failf(w, MBD_E_INVALID, n, field, "'%.40s' is not an integer", s);
  if (v < lo || v > hi)
    return failf(w, MBD_E_INVALID, n, field, "%lld is out of range [%" PRId64 ", %" PRId64 "]", v,
                 lo, hi);
  *out = v;
  return 0;
}

static int get_int32(walker *w, const yaml_node_t *n, const char *field, int lo, int hi, int *out) {
  int64_t v = 0;
  int rc = get_int(w, n, field, lo, hi, &v);
  if (rc == 0) *out = (int)v;
  return rc;
}

static int get_bool(walker *w, const yaml_node_t *n, const char *field, bool *out) {
  int rc = want_kind(w, n, YAML_SCALAR_NODE, field);
  if (rc) return rc;
  const char *s = scalar(n);
  if (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on")) *out = true;
  else if (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off")) *out = false;
  else return failf(w, MBD_E_INVALID, n, field, "'%.40s' is not true or false", s);
  return 0;
}

/* Names: letters, digits, '.', '_', '-'; they end up in flags and file names. */
static int get_name(walker *w, const yaml_node_t *n, const char *field, char *dst, size_t cap) {
  int rc = get_str(w, n, field, dst, cap);
  if (rc) return rc;
  for (const char *p = dst; *p; p++) {
    char ch = *p;
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok)
      return failf(w, MBD_E_INVALID, n, field,
                   "'%s' may hold only letters, digits, '.', '_' and '-'", dst);
  }
  return 0;
}

/* Checks mapping n has only `known` keys (scalars, no duplicates). */
static int check_keys(walker *w, const yaml_node_t *n, const char *field, const char *const *known) {
  int rc = want_kind(w, n, YAML_MAPPING_NODE, field);
  if (rc) return rc;
  yaml_node_pair_t *b = n->data.mapping.pairs.start, *e = n->data.mapping.pairs.top;
  if (e - b > MAX_MAP_KEYS) return failf(w, MBD_E_INVALID, n, field, "has too many keys");
  for (yaml_node_pair_t *p = b; p < e; p++) {
    yaml_node_t *k = node_at(w, p->key);
    if (!k || k->type != YAML_SCALAR_NODE)
      return failf(w, MBD_E_INVALID, k ? k : n, field, "keys must be plain words");
    bool ok = false;
    for (const char *const *q = known; *q; q++) ok = ok || !strcmp(*q, scalar(k));
    if (!ok) {
      char list[256] = "";
      for (const char *const *q = known; *q; q++) {
        strncat(list, *q, sizeof list - strlen(list) - 1);
        if (q[1]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      }
      return failf(w, MBD_E_INVALID, k, field, "unknown key '%.40s' (known: %s)", scalar(k), list);
    }
    for (yaml_node_pair_t *o = b; o < p; o++)
      if (!strcmp(scalar(node_at(w, o->key)), scalar(k)))
        return failf(w, MBD_E_INVALID, k, field, "key '%s' appears twice", scalar(k));
  }
  return 0;
}

/* Value of key in mapping n (already checked by check_keys), or NULL. */
static yaml_node_t *map_get(walker *w, const yaml_node_t *n, const char *key) {
  for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++)
    if (!strcmp(scalar(node_at(w, p->key)), key)) return node_at(w, p->value);
  return NULL;
}

static int check_endpoint(walker *w, const yaml_node_t *n, const char *field, const char *ep) {
  if (!strncmp(ep, "ipc://", 6)) {
    if (!ep[6]) return failf(w, MBD_E_INVALID, n, field, "ipc:// needs a path (ipc:///tmp/mambad/clients.sock)");
    return 0;
  }
  if (!strncmp(ep, "tcp://", 6)) {
    const char *colon = strrchr(ep + 6, ':');
    if (!colon || colon == ep + 6)
      return failf(w, MBD_E_INVALID, n, field, "'%s' needs host:port (tcp://*:5555)", ep);
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 1 || port > 65535)
      return failf(w, MBD_E_INVALID, n, field, "'%s': port must be 1..65535", ep);
    return 0;
  }
  return failf(w, MBD_E_INVALID, n, field, "'%s' must start with ipc:// or tcp://", ep);
}

static int parse_broker(walker *w, const yaml_node_t *n, mbd_deploy_config *c) {
  static const char *const keys[] = {"clients",        "workers",  "heartbeat_ms",
                                     "liveness",       "queue_limit", "queue_mb",
                                     "max_message_mb", "default_deadline_ms", NULL};
  int rc = check_keys(w, n, "broker", keys);
  if (rc) return rc;
  yaml_node_t *v;
  if (!(v = map_get(w, n, "clients")))
    return failf(w, MBD_E_INVALID, n, "broker.clients", "missing (e.g. ipc:///tmp/mambad/clients.sock)");
  if ((rc = get_str(w, v, "broker.clients", c->clients_ep, sizeof c->clients_ep)) ||
      (rc = check_endpoint(w, v, "broker.clients", c->clients_ep)))
    return rc;
  if (!(v = map_get(w, n, "workers")))
    return failf(w, MBD_E_INVALID, n, "broker.workers", "missing (e.g. ipc:///tmp/mambad/workers.sock)");
  if ((rc = get_str(w, v, "broker.workers", c->workers_ep, sizeof c->workers_ep)) ||
      (rc = check_endpoint(w, v, "broker.workers", c->workers_ep)))
    return rc;
  if (!strcmp(c->clients_ep, c->workers_ep))
    return failf(w, MBD_E_INVALID, v, "broker.workers", "must differ from broker.clients");
  if ((v = map_get(w, n, "heartbeat_ms")) &&
      (rc = get_int(w, v, "broker.heartbeat_ms", MBD_HEARTBEAT_MS_MIN, MBD_HEARTBEAT_MS_MAX,
                    &c->heartbeat_ms)))
    return rc;
  if ((v = map_get(w, n, "liveness")) && (rc = get_int(w, v, "broker.liveness", 1, MBD_LIVENESS_MAX, &c->liveness)))
    return rc;
  if ((v = map_get(w, n, "queue_limit")) &&
      (rc = get_int(w, v, "broker.queue_limit", 1, MBD_QUEUE_LIMIT_MAX, &c->queue_limit)))
    return rc;
  if ((v = map_get(w, n, "queue_mb")) &&
      (rc = get_int(w, v, "broker.queue_mb", 1, MBD_QUEUE_MB_MAX, &c->queue_mb)))
    return rc;
  if ((v = map_get(w, n, "max_message_mb")) &&
      (rc = get_int(w, v, "broker.max_message_mb", 1, MBD_MAX_MESSAGE_MB_MAX, &c->max_message_mb)))
    return rc;
  if ((v = map_get(w, n, "default_deadline_ms")) &&
      (rc = get_int(w, v, "broker.default_deadline_ms", 1, MBD_DEADLINE_MS_MAX,
                    &c->default_deadline_ms)))
    return rc;
  return 0;
}

static int parse_http(walker *w, const yaml_node_t *n, mbd_deploy_config *c) {
  static const char *const keys[] = {"listen", "max_body_bytes", "conn_timeout_s", "max_running",
                                     "deadline_ms", NULL};
  mbd_deploy_http *h = &c->http;
  int rc = check_keys(w, n, "http", keys);
  if (rc) return rc;
  h->enabled = true;
  h->line = (int)n->start_mark.line + 1;
  yaml_node_t *v;
  if (!(v = map_get(w, n, "listen")))
    return failf(w, MBD_E_INVALID, n, "http.listen", "missing (e.g. \"127.0.0.1:8000\")");
  if ((rc = get_str(w, v, "http.listen", h->listen, sizeof h->listen))) return rc;
  const char *colon = strrchr(h->listen, ':');
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == h->listen || !colon[1] || *end || port < 0 || port > 65535)
    return failf(w, MBD_E_INVALID, v, "http.listen", "'%s' must be HOST:PORT (127.0.0.1:8000)",
                 h->listen);
  if ((v = map_get(w, n, "max_body_bytes")) &&
      (rc = get_int(w, v, "http.max_body_bytes", 1024, 1ll << 30, &h->max_body_bytes)))
    return rc;
  if ((v = map_get(w, n, "conn_timeout_s")) &&
      (rc = get_int(w, v, "http.conn_timeout_s", 1, 3600, &h->conn_timeout_s)))
    return rc;
  if ((v = map_get(w, n, "max_running")) &&
      (rc = get_int(w, v, "http.max_running", 1, 65536, &h->max_running)))
    return rc;
  if ((v = map_get(w, n, "deadline_ms")) &&
      (rc = get_int(w, v, "http.deadline_ms", 1, 86400000, &h->deadline_ms)))
    return rc;
  return 0;
}

/* The deployment-wide durable settings (before the workers, which inherit
 * the cadence). A cadence needs a broker that keeps checkpoints. */
static int parse_durable(walker *w, const yaml_node_t *n, mbd_deploy_config *c) {
  static const char *const keys[] = {"checkpoint_tokens", "checkpoint_ms", "budget_mb", NULL};
  int rc = check_keys(w, n, "durable", keys);
  if (rc) return rc;
  yaml_node_t *v;
  if ((v = map_get(w, n, "checkpoint_tokens")) &&
      (rc = get_int32(w, v, "durable.checkpoint_tokens", 0, MBD_DURABLE_LOG_MAX,
                      &c->checkpoint_tokens)))
    return rc;
  if ((v = map_get(w, n, "checkpoint_ms")) &&
      (rc = get_int32(w, v, "durable.checkpoint_ms", 0, MBD_CHECKPOINT_MS_MAX, &c->checkpoint_ms)))
    return rc;
  if ((v = map_get(w, n, "budget_mb")) &&
      (rc = get_int(w, v, "durable.budget_mb", 0, MBD_DURABLE_MB_MAX, &c->durable_mb)))
    return rc;
  if ((c->checkpoint_tokens || c->checkpoint_ms) && !c->durable_mb)
    return failf(w, MBD_E_INVALID, n, "durable",
                 "budget_mb: 0 keeps no checkpoints, so the workers' checkpoint_tokens/_ms "
                 "would be sent for nothing: set budget_mb > 0 or both cadences to 0");
  return 0;
}

/* The deployment-wide prefix state cache (before the workers, which inherit it). */
static int parse_prefix_cache(walker *w, const yaml_node_t *n, mbd_deploy_config *c) {
  static const char *const keys[] = {"mb", "block", "device_mb", NULL};
  int rc = check_keys(w, n, "prefix_cache", keys);
  if (rc) return rc;
  mbd_deploy_prefix_cache *pc = &c->prefix_cache;
  yaml_node_t *v;
  if ((v = map_get(w, n, "mb")) &&
      (rc = get_int(w, v, "prefix_cache.mb", 0, MBD_PREFIX_CACHE_MB_MAX, &pc->mb)))
    return rc;
  if ((v = map_get(w, n, "block")) &&
      (rc = get_int32(w, v, "prefix_cache.block", 0, MBD_PREFIX_BLOCK_MAX, &pc->block)))
    return rc;
  if ((v = map_get(w, n, "device_mb")) &&
      (rc = get_int(w, v, "prefix_cache.device_mb", 0, MBD_PREFIX_CACHE_MB_MAX, &pc->device_mb)))
    return rc;
  return 0;
}

static int parse_models(walker *w, const yaml_node_t *n, const char *base_dir,
                        mbd_deploy_config *c) {
  static const char *const keys[] = {"name", "path", "default_digest", NULL};
  int rc = want_kind(w, n, YAML_SEQUENCE_NODE, "models");
  if (rc) return rc;
  for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
    size_t i = (size_t)(it - n->data.sequence.items.start);
    char field[64];
    yaml_node_t *m = node_at(w, *it);
    if (i >= MBD_DEPLOY_MAX_MODELS)
      return failf(w, MBD_E_INVALID, m, "models", "more than %d models", MBD_DEPLOY_MAX_MODELS);
    mbd_deploy_model *md = &c->models[i];
    snprintf(field, sizeof field, "models[%zu]", i);
    if ((rc = check_keys(w, m, field, keys))) return rc;
    md->line = (int)m->start_mark.line + 1;
    yaml_node_t *v = map_get(w, m, "name");
    snprintf(field, sizeof field, "models[%zu].name", i);
    if (!v) return failf(w, MBD_E_INVALID, m, field, "missing");
    if ((rc = get_name(w, v, field, md->name, sizeof md->name))) return rc;
    for (size_t j = 0; j < i; j++)
      if (!strcmp(c->models[j].name, md->name))
        return failf(w, MBD_E_INVALID, v, field, "model '%s' is listed twice", md->name);
    snprintf(field, sizeof field, "models[%zu].path", i);
    char p[MBD_DEPLOY_PATH_MAX];
    if (!(v = map_get(w, m, "path"))) return failf(w, MBD_E_INVALID, m, field, "missing");
    if ((rc = get_str(w, v, field, p, sizeof p))) return rc;
    int len = p[0] == '/' || !base_dir || !*base_dir
                  ? snprintf(md->path, sizeof md->path, "%s", p)
                  : snprintf(md->path, sizeof md->path, "%s/%s", base_dir, p);
    if (len < 0 || (size_t)len >= sizeof md->path)
      return failf(w, MBD_E_INVALID, v, field, "resolved path is longer than %d bytes",
                   MBD_DEPLOY_PATH_MAX - 1);
    md->default_digest[0] = '\0';
    if ((v = map_get(w, m, "default_digest"))) {
      snprintf(field, sizeof field, "models[%zu].default_digest", i);
      if ((rc = get_str(w, v, field, md->default_digest, sizeof md->default_digest))) return rc;
      if (!mbd_digest_prefix_ok(md->default_digest))
        return failf(w, MBD_E_INVALID, v, field,
                     "'%s' is not a lower-case hex prefix of 8 to 64 characters of the weights "
                     "digest (mambad status lists the digests)",
                     md->default_digest);
    }
    c->n_models = i + 1;
  }
  return 0;
}

static int parse_device(walker *w, const yaml_node_t *v, const char *field, mbd_deploy_worker *wk) {
  char dev[32];
  int rc = get_str(w, v, field, dev, sizeof dev);
  if (rc) return rc;
  if (!strcmp(dev, "cpu")) {
    wk->device = MBD_DEPLOY_DEVICE_CPU;
  } else if (!strcmp(dev, "all")) {
    wk->device = MBD_DEPLOY_DEVICE_ALL;
  } else if (!strncmp(dev, "cuda:", 5) && dev[5]) {
    char *end = NULL;
    long idx = strtol(dev + 5, &end, 10);
    if (*end || idx < 0 || idx > 255 || dev[5] == '+' || dev[5] == '-')
      return failf(w, MBD_E_INVALID, v, field, "'%s': the GPU index must be 0..255", dev);
    wk->device = MBD_DEPLOY_DEVICE_CUDA;
    wk->cuda_index = (int)idx;
  } else {
    return failf(w, MBD_E_INVALID, v, field, "'%s' is not cpu, cuda:N or all", dev);
  }
  return 0;
}

/* A state_dtype value (f32 | bf16) into dst. */
static int get_state_dtype(walker *w, const yaml_node_t *v, const char *field, char *dst,
                           size_t cap) {
  mbd_state_dtype sd;
  mbd_error perr;
  int rc = get_str(w, v, field, dst, cap);
  if (rc) return rc;
  if (mbd_state_dtype_parse(dst, &sd, &perr)) return failf(w, MBD_E_INVALID, v, field, "%s", perr.msg);
  return 0;
}

static int parse_worker(walker *w, const yaml_node_t *m, size_t i, mbd_deploy_config *c) {
  static const char *const keys[] = {"name",     "device",    "dtype",          "gemm_mode",
                                     "state_dtype", "threads",  "capacity",  "sessions",       "max_batch",
                                     "session_idle_s", "checkpoint_tokens", "checkpoint_ms",
                                     "prefix_cache_mb", "prefix_block", "prefix_cache_device_mb",
                                     "models", "count", NULL};
  mbd_deploy_worker *wk = &c->workers[i];
  char field[64];
  snprintf(field, sizeof field, "workers[%zu]", i);
  int rc = check_keys(w, m, field, keys);
  if (rc) return rc;
  wk->line = (int)m->start_mark.line + 1;
  wk->count = 1;
  yaml_node_t *v;
#define FIELD(k) (snprintf(field, sizeof field, "workers[%zu].%s", i, k), field)
  if (!(v = map_get(w, m, "name"))) return failf(w, MBD_E_INVALID, m, FIELD("name"), "missing");
  if ((rc = get_name(w, v, FIELD("name"), wk->name, 48))) return rc;
  for (size_t j = 0; j < i; j++)
    if (!strcmp(c->workers[j].name, wk->name))
      return failf(w, MBD_E_INVALID, v, field, "worker '%s' is listed twice", wk->name);
  if (!(v = map_get(w, m, "device")))
    return failf(w, MBD_E_INVALID, m, FIELD("device"), "missing (cpu, cuda:N or all)");
  if ((rc = parse_device(w, v, FIELD("device"), wk))) return rc;
  if ((v = map_get(w, m, "dtype"))) {
    mbd_dtype_policy p;
    mbd_error perr;
    if ((rc = get_str(w, v, FIELD("dtype"), wk->dtype, sizeof wk->dtype))) return rc;
    if (mbd_dtype_policy_parse(wk->dtype, &p, &perr))
      return failf(w, MBD_E_INVALID, v, field, "%s", perr.msg);
  }
  if ((v = map_get(w, m, "gemm_mode"))) {
    mbd_gemm_mode gm;
    mbd_error perr;
    if ((rc = get_str(w, v, FIELD("gemm_mode"), wk->gemm_mode, sizeof wk->gemm_mode))) return rc;
    if (mbd_gemm_mode_parse(wk->gemm_mode, &gm, &perr))
      return failf(w, MBD_E_INVALID, v, field, "%s", perr.msg);
  }
  memcpy(wk->state_dtype, c->state_dtype, sizeof wk->state_dtype);
  const yaml_node_t *sdn = m; /* where an unusable state dtype is reported */
  if ((v = map_get(w, m, "state_dtype"))) {
    if ((rc = get_state_dtype(w, v, FIELD("state_dtype"), wk->state_dtype,
                              sizeof wk->state_dtype)))
      return rc;
    sdn = v;
  }
  if (!strcmp(wk->state_dtype, "bf16") && wk->device == MBD_DEPLOY_DEVICE_CPU)
    return failf(w, MBD_E_INVALID, sdn, FIELD("state_dtype"),
                 "worker '%s' runs on the cpu, and state dtype bf16 is supported for %s: give "
                 "it state_dtype: f32",
                 wk->name, mbd_state_dtype_where(MBD_STATE_BF16));
  if ((v = map_get(w, m, "threads")) && (rc = get_int32(w, v, FIELD("threads"), 0, 1024, &wk->threads)))
    return rc;
  if ((v = map_get(w, m, "capacity")) &&
      (rc = get_int32(w, v, FIELD("capacity"), 1, MBD_CAPACITY_MAX, &wk->capacity)))
    return rc;
  if ((v = map_get(w, m, "sessions")) &&
      (rc = get_int32(w, v, FIELD("sessions"), 1, MBD_SESSIONS_MAX, &wk->sessions)))
    return rc;
  if ((v = map_get(w, m, "max_batch")) &&
      (rc = get_int32(w, v, FIELD("max_batch"), 1, MBD_MAX_BATCH_MAX, &wk->max_batch)))
    return rc;
  if ((v = map_get(w, m, "session_idle_s")) &&
      (rc = get_int32(w, v, FIELD("session_idle_s"), 1, 86400 * 30, &wk->session_idle_s)))
    return rc;
  wk->checkpoint_tokens = c->checkpoint_tokens;
  wk->checkpoint_ms = c->checkpoint_ms;
  const yaml_node_t *cadence = NULL; /* the worker's own cadence key, for the check below */
  const char *cadence_key = NULL;
  if ((v = map_get(w, m, "checkpoint_tokens"))) {
    if ((rc = get_int32(w, v, FIELD("checkpoint_tokens"), 0, MBD_DURABLE_LOG_MAX,
                        &wk->checkpoint_tokens)))
      return rc;
    if (wk->checkpoint_tokens) {
      cadence = v;
      cadence_key = "checkpoint_tokens";
    }
  }
  if ((v = map_get(w, m, "checkpoint_ms"))) {
    if ((rc = get_int32(w, v, FIELD("checkpoint_ms"), 0, MBD_CHECKPOINT_MS_MAX,
                        &wk->checkpoint_ms)))
      return rc;
    if (wk->checkpoint_ms && !cadence) {
      cadence = v;
      cadence_key = "checkpoint_ms";
    }
  }
  if (cadence && !c->durable_mb)
    return failf(w, MBD_E_INVALID, cadence, FIELD(cadence_key),
                 "worker '%s' checkpoints, but durable.budget_mb is 0 (the broker keeps none): "
                 "set durable.budget_mb > 0 or this worker's cadences to 0",
                 wk->name);
  wk->prefix_cache = c->prefix_cache;
  if ((v = map_get(w, m, "prefix_cache_mb")) &&
      (rc = get_int(w, v, FIELD("prefix_cache_mb"), 0, MBD_PREFIX_CACHE_MB_MAX,
                    &wk->prefix_cache.mb)))
    return rc;
  if ((v = map_get(w, m, "prefix_block")) &&
      (rc = get_int32(w, v, FIELD("prefix_block"), 0, MBD_PREFIX_BLOCK_MAX,
                      &wk->prefix_cache.block)))
    return rc;
  if ((v = map_get(w, m, "prefix_cache_device_mb")) &&
      (rc = get_int(w, v, FIELD("prefix_cache_device_mb"), 0, MBD_PREFIX_CACHE_MB_MAX,
                    &wk->prefix_cache.device_mb)))
    return rc;
  if ((v = map_get(w, m, "count"))) {
    if ((rc = get_int32(w, v, FIELD("count"), 1, 64, &wk->count))) return rc;
    if (wk->count > 1 && wk->device != MBD_DEPLOY_DEVICE_CPU)
      return failf(w, MBD_E_INVALID, v, field,
                   "replicas are for cpu workers; list one worker per GPU or use device: all");
  }
  if ((v = map_get(w, m, "models"))) {
    if ((rc = want_kind(w, v, YAML_SEQUENCE_NODE, FIELD("models")))) return rc;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
      size_t k = (size_t)(it - v->data.sequence.items.start);
      char name[MBD_DEPLOY_NAME_MAX];
      yaml_node_t *e = node_at(w, *it);
      snprintf(field, sizeof field, "workers[%zu].models[%zu]", i, k);
      if (k >= MBD_DEPLOY_MAX_MODELS)
        return failf(w, MBD_E_INVALID, e, field, "more than %d models", MBD_DEPLOY_MAX_MODELS);
      if ((rc = get_name(w, e, field, name, sizeof name))) return rc;
      int found = -1;
      for (size_t j = 0; j < c->n_models; j++)
        if (!strcmp(c->models[j].name, name)) found = (int)j;
      if (found < 0)
        return failf(w, MBD_E_NOT_FOUND, e, field, "model '%s' is not in the models: catalogue", name);
      for (size_t j = 0; j < k; j++)
        if (wk->models[j] == found)
          return failf(w, MBD_E_INVALID, e, field, "model '%s' is listed twice", name);
      wk->models[k] = found;
      wk->n_models = k + 1;
    }
  } else { /* no list: the worker serves the whole catalogue */
    for (size_t j = 0; j < c->n_models; j++) wk->models[j] = (int)j;
    wk->n_models = c->n_models;
  }
#undef FIELD
  return 0;
}

static int parse_workers(walker *w, const yaml_node_t *n, mbd_deploy_config *c) {
  int rc = want_kind(w, n, YAML_SEQUENCE_NODE, "workers");
  if (rc) return rc;
  for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
    size_t i = (size_t)(it - n->data.sequence.items.start);
    if (i >= MBD_DEPLOY_MAX_WORKERS)
      return failf(w, MBD_E_INVALID, node_at(w, *it), "workers", "more than %d workers",
                   MBD_DEPLOY_MAX_WORKERS);
    if ((rc = parse_worker(w, node_at(w, *it), i, c))) return rc;
    c->n_workers = i + 1;
  }
  return 0;
}

static int get_key(walker *w, const yaml_node_t *n, const char *field, char dst[41]) {
  static const char z85[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  int rc = get_str(w, n, field, dst, 41);
  if (rc) return rc;
  if (strlen(dst) != 40 || strspn(dst, z85) != 40)
    return failf(w, MBD_E_INVALID, n, field,
                 "must be a 40-character Z85 CURVE key (make one with `curve_keygen`)");
  return 0;
}

/* A key file or key list path: a Z85 key stays as is, a relative path is
 * resolved against the YAML file's directory. */
static int get_keyspec(walker *w, const yaml_node_t *n, const char *field, const char *base_dir,
                       char *dst, size_t cap) {
  char v[MBD_DEPLOY_PATH_MAX];
  int rc = get_str(w, n, field, v, sizeof v);
  if (rc) return rc;
  if (!v[0]) return failf(w, MBD_E_INVALID, n, field, "is empty");
  static const char z85[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  bool key = strlen(v) == 40 && strspn(v, z85) == 40; /* as the broker reads a SPEC */
  int len = key || v[0] == '/' || !base_dir || !*base_dir ? snprintf(dst, cap, "%s", v)
                                                          : snprintf(dst, cap, "%s/%s", base_dir, v);
  if (len < 0 || (size_t)len >= cap)
    return failf(w, MBD_E_INVALID, n, field, "resolved path is longer than %zu bytes", cap - 1);
  return 0;
}

static int parse_insecure(walker *w, const yaml_node_t *n, mbd_deploy_security *s) {
  static const char *const keys[] = {"clients", "workers", NULL};
  int rc = check_keys(w, n, "security.insecure", keys);
  if (rc) return rc;
  yaml_node_t *v;
  if ((v = map_get(w, n, "clients")) &&
      (rc = get_bool(w, v, "security.insecure.clients", &s->insecure_clients)))
    return rc;
  if ((v = map_get(w, n, "workers")) &&
      (rc = get_bool(w, v, "security.insecure.workers", &s->insecure_workers)))
    return rc;
  return 0;
}

static int parse_security(walker *w, const yaml_node_t *n, const char *base_dir,
                          mbd_deploy_config *c) {
  static const char *const keys[] = {"curve", "server_public_key", "server_secret_key",
                                     "client_public_keys", "broker_key", "worker_key",
                                     "client_keys", "worker_keys", "operator_keys", "insecure",
                                     "ipc_group", NULL};
  mbd_deploy_security *s = &c->security;
  int rc = check_keys(w, n, "security", keys);
  if (rc) return rc;
  yaml_node_t *v;
  if ((v = map_get(w, n, "curve")) && (rc = get_bool(w, v, "security.curve", &s->curve))) return rc;
  if ((v = map_get(w, n, "server_public_key")) &&
      (rc = get_key(w, v, "security.server_public_key", s->server_public_key)))
    return rc;
  if ((v = map_get(w, n, "server_secret_key")) &&
      (rc = get_key(w, v, "security.server_secret_key", s->server_secret_key)))
    return rc;
  if ((v = map_get(w, n, "client_public_keys"))) {
    if ((rc = want_kind(w, v, YAML_SEQUENCE_NODE, "security.client_public_keys"))) return rc;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
      size_t k = (size_t)(it - v->data.sequence.items.start);
      char field[64];
      snprintf(field, sizeof field, "security.client_public_keys[%zu]", k);
      if (k >= MBD_DEPLOY_MAX_CLIENT_KEYS)
        return failf(w, MBD_E_INVALID, node_at(w, *it), field, "more than %d keys",
                     MBD_DEPLOY_MAX_CLIENT_KEYS);
      if ((rc = get_key(w, node_at(w, *it), field, s->client_public_keys[k]))) return rc;
      s->n_client_keys = k + 1;
    }
  }
  static const struct {
    const char *key;
    size_t off;
  } specs[] = {{"broker_key", offsetof(mbd_deploy_security, broker_key)},
               {"worker_key", offsetof(mbd_deploy_security, worker_key)},
               {"client_keys", offsetof(mbd_deploy_security, client_keys)},
               {"worker_keys", offsetof(mbd_deploy_security, worker_keys)},
               {"operator_keys", offsetof(mbd_deploy_security, operator_keys)}};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    char field[64];
    snprintf(field, sizeof field, "security.%s", specs[i].key);
    if ((v = map_get(w, n, specs[i].key)) &&
        (rc = get_keyspec(w, v, field, base_dir, (char *)s + specs[i].off, MBD_DEPLOY_PATH_MAX)))
      return rc;
  }
  if ((v = map_get(w, n, "ipc_group")) &&
      (rc = get_str(w, v, "security.ipc_group", s->ipc_group, sizeof s->ipc_group)))
    return rc;
  if ((v = map_get(w, n, "insecure"))) {
    if ((rc = want_kind(w, v, YAML_MAPPING_NODE, "security.insecure"))) return rc;
    if ((rc = parse_insecure(w, v, s))) return rc;
  }
  if (s->curve && !s->broker_key[0])
    return failf(w, MBD_E_INVALID, n, "security",
                 "curve: true needs broker_key (the broker's secret file from `mambad keygen`)");
  return 0;
}

/* The tcp rule: CURVE with the keys it needs, or an endpoint marked insecure. */
static int check_transport(walker *w, const yaml_node_t *root, const mbd_deploy_config *c) {
  const mbd_deploy_security *s = &c->security;
  const char *eps[2] = {c->clients_ep, c->workers_ep}, *names[2] = {"clients", "workers"};
  bool insecure[2] = {s->insecure_clients, s->insecure_workers};
  for (int i = 0; i < 2; i++) {
    if (strncmp(eps[i], "tcp://", 6)) continue;
    if (!s->curve && !insecure[i])
      return failf(w, MBD_E_INVALID, root, i == 0 ? "broker.clients" : "broker.workers",
                   "%s is tcp without CURVE: set security.curve: true with broker_key and the "
                   "admitted keys, or security.insecure.%s: true on a trusted network",
                   eps[i], names[i]);
    if (s->curve && i == 1 && (!s->worker_keys[0] || !s->worker_key[0]))
      return failf(w, MBD_E_INVALID, root, "security",
                   "a CURVE workers endpoint needs worker_keys (admitted) and worker_key (the "
                   "workers' own secret file)");
  }
  return 0;
}

int mbd_deploy_config_parse(const char *text, size_t len, const char *label, const char *base_dir,
                            mbd_deploy_config **out, mbd_error *err) {
  *out = NULL;
  if (!label) label = "<memory>";
  mbd_deploy_config *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading %s", label);
  snprintf(c->path, sizeof c->path, "%s", label);
  c->heartbeat_ms = MBD_DEFAULT_HEARTBEAT_MS;
  c->liveness = MBD_DEFAULT_LIVENESS;
  c->queue_limit = MBD_DEFAULT_QUEUE_LIMIT;
  c->queue_mb = MBD_DEFAULT_QUEUE_MB;
  c->max_message_mb = MBD_DEFAULT_MAX_MESSAGE_MB;
  c->default_deadline_ms = MBD_DEFAULT_DEADLINE_MS;
  c->durable_mb = MBD_DEFAULT_DURABLE_MB;
  c->checkpoint_tokens = MBD_DEFAULT_CHECKPOINT_TOKENS;
  c->checkpoint_ms = MBD_DEFAULT_CHECKPOINT_MS;
  c->prefix_cache.mb = MBD_DEFAULT_PREFIX_CACHE_MB;
  c->prefix_cache.block = MBD_DEFAULT_PREFIX_BLOCK;
  c->prefix_cache.device_mb = MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB;

  yaml_parser_t parser;
  yaml_document_t doc;
  bool have_parser = false, have_doc = false;
  walker w = {&doc, label, err};
  int rc = 0;
  if (!yaml_parser_initialize(&parser)) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory starting the YAML parser");
    goto fail;
  }
  have_parser = true;
  /* libyaml asserts on a NULL input even when len is 0 */
  yaml_parser_set_input_string(&parser, (const unsigned char *)(text ? text : ""), text ? len : 0);
  if (!yaml_parser_load(&parser, &doc)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s:%d: not valid YAML: %s%s%s", label,
                       (int)parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "parse error",
                       parser.context ? " " : "", parser.context ? parser.context : "");
    goto fail;
  }
  have_doc = true;
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  if (!root) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s:1: the file is empty; it needs at least a broker: section", label);
    goto fail;
  }
  static const char *const keys[] = {"broker",   "durable", "prefix_cache", "state_dtype",
                                     "models",   "workers", "security",     "http",
                                     NULL};
  if ((rc = check_keys(&w, root, "top level", keys))) goto fail;
  yaml_node_t *v = map_get(&w, root, "broker");
  if (!v) {
    rc = failf(&w, MBD_E_INVALID, root, "broker", "missing (needs clients: and workers: endpoints)");
    goto fail;
  }
  if ((rc = parse_broker(&w, v, c))) goto fail;
  /* durable, prefix_cache and state_dtype before workers: workers inherit them */
  if ((v = map_get(&w, root, "durable")) && (rc = parse_durable(&w, v, c))) goto fail;
  if ((v = map_get(&w, root, "prefix_cache")) && (rc = parse_prefix_cache(&w, v, c))) goto fail;
  if ((v = map_get(&w, root, "state_dtype")) &&
      (rc = get_state_dtype(&w, v, "state_dtype", c->state_dtype, sizeof c->state_dtype)))
    goto fail;
  /* models before workers: workers name catalogue entries */
  if ((v = map_get(&w, root, "models")) && (rc = parse_models(&w, v, base_dir, c))) goto fail;
  if ((v = map_get(&w, root, "workers")) && (rc = parse_workers(&w, v, c))) goto fail;
  if ((v = map_get(&w, root, "security")) && (rc = parse_security(&w, v, base_dir, c))) goto fail;
  if ((v = map_get(&w, root, "http")) && (rc = parse_http(&w, v, c))) goto fail;
  if ((rc = check_transport(&w, root, c))) goto fail;
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  *out = c;
  return 0;
fail:
  if (have_doc) yaml_document_delete(&doc);
  if (have_parser) yaml_parser_delete(&parser);
  free(c);
  return rc;
}

int mbd_deploy_config_load(const char *path, mbd_deploy_config **out, mbd_error *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return mbd_error_set(err, MBD_E_IO, "cannot open %s: %s", path, strerror(errno));
  char *buf = NULL;
  size_t cap = 0, len = 0;
  int rc = 0;
  for (;;) {
    if (len == cap) {
      if (cap >= (size_t)16 << 20) {
        rc = mbd_error_set(err, MBD_E_TOO_LARGE, "%s is over 16 MiB; is it really a deployment file?", path);
        goto done;
      }
      cap = cap ? cap * 2 : 4096;
      char *nb = realloc(buf, cap);
      if (!nb) {
        rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading %s", path);
        goto done;
      }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    rc = mbd_error_set(err, MBD_E_IO, "reading %s: %s", path, strerror(errno));
    goto done;
  }
  /* Model paths resolve against the file's absolute directory, so workers
   * started from any working directory find them. */
  char *abs = realpath(path, NULL);
  char dir[MBD_DEPLOY_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", abs ? abs : path);
  free(abs);
  char *slash = strrchr(dir, '/');
  if (slash == dir) dir[1] = '\0';
  else if (slash) *slash = '\0';
  else snprintf(dir, sizeof dir, ".");
  rc = mbd_deploy_config_parse(buf, len, path, dir, out, err);
done:
  free(buf);
  fclose(f);
  return rc;
}

void mbd_deploy_config_free(mbd_deploy_config **c) {
  if (!c || !*c) return;
  free(*c);
  *c = NULL;
}

void mbd_deploy_connect_endpoint(const char *ep, char *out, size_t cap) {
  if (!strncmp(ep, "tcp://*:", 8)) snprintf(out, cap, "tcp://127.0.0.1:%s", ep + 8);
  else if (!strncmp(ep, "tcp://0.0.0.0:", 14)) snprintf(out, cap, "tcp://127.0.0.1:%s", ep + 14);
  else snprintf(out, cap, "%s", ep);
}
