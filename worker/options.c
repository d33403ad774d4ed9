/* The worker's command line: defaults, parsing and the usage text. Every
 * option lands in one plain struct that the rest of the worker reads. */
#include "worker/options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/defaults.h"
#include "common/host_id.h"

const char *mbd_worker_usage(void) {
  return "usage: mambad-worker --connect EP --name NAME [--device cpu|cuda:N] [--dtype f32|bf16|f16]\n"
         "         [--state-dtype f32|bf16] [--gemm-mode deterministic] [--model NAME=DIR]...\n"
         "         [--threads N]\n"
         "         [--capacity N] [--sessions N] [--client-sessions N] [--max-batch N]\n"
         "         [--heartbeat-ms MS] [--liveness N] [--session-idle-s S] [--host-id ID]\n"
         "         [--max-message-mb N] [--slice-tokens N] [--drain-ms MS] [--overlap-steps 0|1]\n"
         "         [--checkpoint-tokens N] [--checkpoint-ms MS]\n"
         "         [--prefix-cache-mb N] [--prefix-cache-device-mb N] [--prefix-block N]\n"
         "         [--curve-secret FILE --server-key KEY|FILE]\n"
         "--capacity: requests the broker sends at once (1..4096, default 64);\n"
         "--sessions: session slots (default: the capacity); both defaults: common/defaults.h\n"
         "--state-dtype: storage of the recurrent state (default f32; bf16: Mamba-2 on cuda only,\n"
         "  its own route with its own tolerance, docs/route.md)\n"
         "--checkpoint-tokens/--checkpoint-ms: durable sessions (docs/architecture.md), 0 = off\n"
         "--prefix-cache-mb: prefix state cache per model (default 256; 0 = off);\n"
         "--prefix-cache-device-mb: its device tier on GPU workers (default 1024; 0 = off);\n"
         "--prefix-block: tokens between cached prefix boundaries (default 256; 0 = off)\n"
         "--overlap-steps: 1 (default): a batched step's replies go out while the next step\n"
         "  computes; 0: before it is launched (the same replies; for comparisons)\n";
}

static int parse_int(const char *flag, const char *v, long lo, long hi, long *out, mbd_error *err) {
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || !*v || *end || x < lo || x > hi)
    return mbd_error_set(err, MBD_E_INVALID, "%s expects an integer in %ld..%ld (got '%s')", flag,
                         lo, hi, v);
  *out = x;
  return MBD_OK;
}

static bool valid_name(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '-' || *s == '_' || *s == '.'))
      return false;
  return true;
}

int mbd_worker_opts_parse(int argc, char **argv, mbd_worker_opts *o, mbd_error *err) {
  memset(o, 0, sizeof *o);
  o->backend = MBD_BACKEND_CPU;
  o->device = -1;
  o->mode = MBD_GEMM_DETERMINISTIC;
  o->policy = MBD_POLICY_F32;
  o->state = MBD_STATE_F32;
  o->capacity = MBD_DEFAULT_CAPACITY;
  o->sessions = 0; /* resolved after parsing */
  o->max_batch = MBD_DEFAULT_MAX_BATCH;
  o->heartbeat_ms = MBD_DEFAULT_HEARTBEAT_MS;
  o->liveness = MBD_DEFAULT_LIVENESS;
  o->session_idle_s = MBD_DEFAULT_SESSION_IDLE_S;
  o->slice_tokens = MBD_DEFAULT_SLICE_TOKENS;
  o->drain_ms = MBD_DEFAULT_DRAIN_MS;
  o->overlap_steps = true;
  o->checkpoint_tokens = MBD_DEFAULT_CHECKPOINT_TOKENS;
  o->checkpoint_ms = MBD_DEFAULT_CHECKPOINT_MS;
  o->prefix_cache_mb = MBD_DEFAULT_PREFIX_CACHE_MB;
  o->prefix_block = MBD_DEFAULT_PREFIX_BLOCK;
  o->prefix_cache_device_mb = MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB;
  o->max_message_bytes = (size_t)MBD_DEFAULT_MAX_MESSAGE_MB << 20;
  int rc;
  long v = 0;
  const char *gemm_flag = NULL; /* --gemm-mode, else MBD_GEMM_MODE */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h"))
      return mbd_error_set(err, MBD_E_INVALID, "%s", mbd_worker_usage());
    if (strncmp(a, "--", 2) || i + 1 >= argc)
      return mbd_error_set(err, MBD_E_INVALID, "unknown argument or missing value: '%s'\n%s", a,
                           mbd_worker_usage());
    const char *val = argv[++i];
    if (!strcmp(a, "--connect")) {
      if (strlen(val) >= sizeof o->connect)
        return mbd_error_set(err, MBD_E_INVALID, "--connect endpoint too long");
      snprintf(o->connect, sizeof o->connect, "%s", val);
    } else if (!strcmp(a, "--name")) {
      if (strlen(val) >= sizeof o->name || !valid_name(val))
        return mbd_error_set(err, MBD_E_INVALID,
                             "--name must be 1..%zu characters of [A-Za-z0-9._-] (got '%s')",
                             sizeof o->name - 1, val);
      snprintf(o->name, sizeof o->name, "%s", val);
    } else if (!strcmp(a, "--device")) {
      if (!strncmp(val, "cuda:", 5)) { /* cuda:N pins the worker to device N */
        if ((rc = parse_int(a, val + 5, 0, 1023, &v, err))) return rc;
        o->backend = MBD_BACKEND_CUDA;
        o->device = (int)v;
      } else if ((rc = mbd_backend_parse(val, &o->backend, err))) {
        return mbd_error_prefix(err, "--device (cpu or cuda:N)");
      } else {
        o->device = o->backend == MBD_BACKEND_CUDA ? 0 : -1;
      }
    } else if (!strcmp(a, "--dtype")) {
      if ((rc = mbd_dtype_policy_parse(val, &o->policy, err)))
        return mbd_error_prefix(err, "--dtype");
    } else if (!strcmp(a, "--state-dtype")) {
      if ((rc = mbd_state_dtype_parse(val, &o->state, err)))
        return mbd_error_prefix(err, "--state-dtype");
    } else if (!strcmp(a, "--gemm-mode")) {
      gemm_flag = val;
    } else if (!strcmp(a, "--model")) {
      const char *eq = strchr(val, '=');
      if (!eq || eq == val || !eq[1])
        return mbd_error_set(err, MBD_E_INVALID, "--model expects NAME=DIR (got '%s')", val);
      if (o->nmodels >= MBD_WORKER_MAX_MODELS)
        return mbd_error_set(err, MBD_E_INVALID, "at most %d --model flags",
                             MBD_WORKER_MAX_MODELS);
      mbd_worker_model_opt *m = &o->models[o->nmodels];
      size_t nl = (size_t)(eq - val);
      if (nl >= sizeof m->name || strlen(eq + 1) >= sizeof m->dir)
        return mbd_error_set(err, MBD_E_INVALID, "--model '%s': name or path too long", val);
      memcpy(m->name, val, nl);
      m->name[nl] = '\0';
      if (!valid_name(m->name))
        return mbd_error_set(err, MBD_E_INVALID,
                             "--model name '%s' must use only [A-Za-z0-9._-]", m->name);
      for (int j = 0; j < o->nmodels; j++)
        if (!strcmp(o->models[j].name, m->name))
          return mbd_error_set(err, MBD_E_INVALID, "--model name '%s' given twice", m->name);
      snprintf(m->dir, sizeof m->dir, "%s", eq + 1);
      o->nmodels++;
    } else if (!strcmp(a, "--threads")) {
      if ((rc = parse_int(a, val, 0, 1024, &v, err))) return rc;
      o->threads = (int)v;
    } else if (!strcmp(a, "--capacity")) {
      if ((rc = parse_int(a, val, 1, MBD_CAPACITY_MAX, &v, err))) return rc;
      o->capacity = (int)v;
    } else if (!strcmp(a, "--sessions")) {
      if ((rc = parse_int(a, val, 1, MBD_SESSIONS_MAX, &v, err))) return rc;
      o->sessions = (int)v;
    } else if (!strcmp(a, "--curve-secret")) {
      if ((rc = mbd_curve_read_secret(val, &o->curve_key, err))) return rc;
      o->curve = true;
    } else if (!strcmp(a, "--server-key")) {
      if ((rc = mbd_curve_read_public(val, o->server_key, err))) return rc;
    } else if (!strcmp(a, "--client-sessions")) {
      if ((rc = parse_int(a, val, 1, 1 << 20, &v, err))) return rc;
      o->client_sessions = (int)v;
    } else if (!strcmp(a, "--max-batch")) {
      if ((rc = parse_int(a, val, 1, MBD_MAX_BATCH_MAX, &v, err))) return rc;
      o->max_batch = (int)v;
    } else if (!strcmp(a, "--heartbeat-ms")) {
      if ((rc = parse_int(a, val, MBD_HEARTBEAT_MS_MIN, MBD_HEARTBEAT_MS_MAX, &v, err))) return rc;
      o->heartbeat_ms = (int)v;
    } else if (!strcmp(a, "--liveness")) {
      if ((rc = parse_int(a, val, 1, MBD_LIVENESS_MAX, &v, err))) return rc;
      o->liveness = (int)v;
    } else if (!strcmp(a, "--slice-tokens")) {
      if ((rc = parse_int(a, val, 1, 1 << 24, &v, err))) return rc;
      o->slice_tokens = (int)v;
    } else if (!strcmp(a, "--prefix-cache-mb")) {
      if ((rc = parse_int(a, val, 0, MBD_PREFIX_CACHE_MB_MAX, &v, err))) return rc;
      o->prefix_cache_mb = (size_t)v;
    } else if (!strcmp(a, "--prefix-cache-device-mb")) {
      if ((rc = parse_int(a, val, 0, MBD_PREFIX_CACHE_MB_MAX, &v, err))) return rc;
      o->prefix_cache_device_mb = (size_t)v;
    } else if (!strcmp(a, "--prefix-block")) {
      if ((rc = parse_int(a, val, 0, 1 << 24, &v, err))) return rc;
      o->prefix_block = (int)v;
    } else if (!strcmp(a, "--drain-ms")) {
      if ((rc = parse_int(a, val, 0, 3600000, &v, err))) return rc;
      o->drain_ms = (int)v;
    } else if (!strcmp(a, "--overlap-steps")) {
      if ((rc = parse_int(a, val, 0, 1, &v, err))) return rc;
      o->overlap_steps = v == 1;
    } else if (!strcmp(a, "--checkpoint-tokens")) {
      if ((rc = parse_int(a, val, 0, 1 << 24, &v, err))) return rc;
      o->checkpoint_tokens = (int)v;
    } else if (!strcmp(a, "--checkpoint-ms")) {
      if ((rc = parse_int(a, val, 0, 3600000, &v, err))) return rc;
      o->checkpoint_ms = (int)v;
    } else if (!strcmp(a, "--session-idle-s")) {
      if ((rc = parse_int(a, val, 0, 100L * 86400, &v, err))) return rc;
      o->session_idle_s = (double)v;
    } else if (!strcmp(a, "--host-id")) {
      if (!*val || strlen(val) >= sizeof o->host_id)
        return mbd_error_set(err, MBD_E_INVALID, "--host-id must be 1..%zu characters",
                             sizeof o->host_id - 1);
      snprintf(o->host_id, sizeof o->host_id, "%s", val);
    } else if (!strcmp(a, "--max-message-mb")) {
      if ((rc = parse_int(a, val, 1, MBD_MAX_MESSAGE_MB_MAX, &v, err))) return rc;
      o->max_message_bytes = (size_t)v << 20;
    } else {
      return mbd_error_set(err, MBD_E_INVALID, "unknown option '%s'\n%s", a, mbd_worker_usage());
    }
  }
  if (!o->connect[0])
    return mbd_error_set(err, MBD_E_INVALID, "--connect EP is required (the broker's workers "
                         "endpoint, e.g. ipc:///tmp/mambad/workers)");
  if (!o->name[0]) return mbd_error_set(err, MBD_E_INVALID, "--name NAME is required");
  if (o->curve != (o->server_key[0] != '\0'))
    return mbd_error_set(err, MBD_E_INVALID, "--curve-secret FILE and --server-key KEY go together "
                         "(CURVE to a broker's tcp endpoint; keys from `mambad keygen`)");
  if (!o->host_id[0]) mbd_host_id_get(o->host_id, sizeof o->host_id);
  if (!o->sessions) o->sessions = o->capacity;
  if (!o->client_sessions) o->client_sessions = o->sessions * 3 / 4 > 0 ? o->sessions * 3 / 4 : 1;
  if (o->client_sessions > o->sessions) o->client_sessions = o->sessions;
  if ((rc = mbd_gemm_mode_resolve(gemm_flag, &o->mode, err))) return rc;
  return MBD_OK;
}
