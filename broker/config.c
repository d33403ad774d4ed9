/* Broker command line: defaults and parsing into mbd_broker_config. Errors
 * name the option and the accepted range, since a launcher's YAML becomes
 * these flags and the person reading the error edits the YAML. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/core.h"
#include "common/defaults.h"

void mbd_broker_config_defaults(mbd_broker_config *c) {
  memset(c, 0, sizeof *c);
  c->heartbeat_ms = MBD_DEFAULT_HEARTBEAT_MS;
  c->liveness = MBD_DEFAULT_LIVENESS;
  c->queue_limit = MBD_DEFAULT_QUEUE_LIMIT;
  c->queue_mb = MBD_DEFAULT_QUEUE_MB;
  c->max_message_mb = MBD_DEFAULT_MAX_MESSAGE_MB;
  c->default_deadline_ms = MBD_DEFAULT_DEADLINE_MS;
  c->hwm = MBD_DEFAULT_HWM;
  c->client_inflight = 1024;
  c->reclaim_grace_ms = 5000;
  c->durable_mb = MBD_DEFAULT_DURABLE_MB;
}

static int parse_int(const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     mbd_error *err) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || !end || end == v || *end || x < lo || x > hi)
    return mbd_error_set(err, MBD_E_INVALID, "%s: '%s' is not an integer in %" PRId64 "..%" PRId64,
                         opt, v, lo, hi);
  *out = x;
  return MBD_OK;
}

int mbd_broker_config_parse(int argc, char **argv, mbd_broker_config *c, mbd_error *err) {
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (i + 1 >= argc)
      return mbd_error_set(err, MBD_E_INVALID, "option '%s' needs a value (see --help)", o);
    const char *v = argv[++i];
    int64_t x = 0;
    int rc = MBD_OK;
    if (!strcmp(o, "--clients") || !strcmp(o, "--workers")) {
      char *dst = o[2] == 'c' ? c->clients_ep : c->workers_ep;
      if (strlen(v) >= MBD_BROKER_EP_MAX || !strstr(v, "://"))
        return mbd_error_set(err, MBD_E_INVALID, "%s: '%s' is not a ZeroMQ endpoint like tcp://*:5555",
                             o, v);
      snprintf(dst, MBD_BROKER_EP_MAX, "%s", v);
    } else if (!strcmp(o, "--heartbeat-ms")) {
      if (!(rc = parse_int(o, v, MBD_HEARTBEAT_MS_MIN, MBD_HEARTBEAT_MS_MAX, &x, err)))
        c->heartbeat_ms = (int)x;
    } else if (!strcmp(o, "--liveness")) {
      if (!(rc = parse_int(o, v, 1, MBD_LIVENESS_MAX, &x, err))) c->liveness = (int)x;
    } else if (!strcmp(o, "--queue-limit")) {
      if (!(rc = parse_int(o, v, 0, MBD_QUEUE_LIMIT_MAX, &x, err))) c->queue_limit = (int)x;
    } else if (!strcmp(o, "--queue-mb")) {
      if (!(rc = parse_int(o, v, 1, MBD_QUEUE_MB_MAX, &x, err))) c->queue_mb = x;
    } else if (!strcmp(o, "--max-message-mb")) {
      if (!(rc = parse_int(o, v, 1, MBD_MAX_MESSAGE_MB_MAX, &x, err))) c->max_message_mb = x;
    } else if (!strcmp(o, "--default-deadline-ms")) {
      if (!(rc = parse_int(o, v, 1, MBD_DEADLINE_MS_MAX, &x, err))) c->default_deadline_ms = x;
    } else if (!strcmp(o, "--default-digest")) {
      const char *eq = strchr(v, '=');
      size_t nl = eq ? (size_t)(eq - v) : 0;
      if (!eq || nl == 0 || nl >= MBD_BW_NAME_MAX || !mbd_digest_prefix_ok(eq + 1))
        return mbd_error_set(err, MBD_E_INVALID,
                             "--default-digest: '%s' is not NAME=DIGEST with DIGEST a lower-case "
                             "hex prefix of 8 to 64 characters of the model's weights digest",
                             v);
      if (c->ndefaults == MBD_BW_DEFAULTS_MAX)
        return mbd_error_set(err, MBD_E_INVALID, "--default-digest: at most %d",
                             MBD_BW_DEFAULTS_MAX);
      memcpy(c->defaults[c->ndefaults].name, v, nl);
      c->defaults[c->ndefaults].name[nl] = '\0';
      snprintf(c->defaults[c->ndefaults].digest, MBD_BW_DIGEST_MAX, "%s", eq + 1);
      c->ndefaults++;
    } else if (!strcmp(o, "--curve-secret") || !strcmp(o, "--client-keys") ||
               !strcmp(o, "--worker-keys") || !strcmp(o, "--operator-keys")) {
      char *dst = o[2] == 'c' && o[3] == 'u' ? c->curve_secret
                  : o[2] == 'c'              ? c->client_keys
                  : o[2] == 'w'              ? c->worker_keys
                                             : c->operator_keys;
      size_t cap = dst == c->curve_secret ? sizeof c->curve_secret : sizeof c->client_keys;
      if (!v[0] || strlen(v) >= cap)
        return mbd_error_set(err, MBD_E_INVALID, "%s: value empty or longer than %zu characters", o,
                             cap - 1);
      if (dst[0] && dst != c->curve_secret) { /* repeated: a comma-separated list */
        if (strlen(dst) + 1 + strlen(v) >= cap)
          return mbd_error_set(err, MBD_E_INVALID, "%s: too many keys", o);
        strcat(dst, ",");
        strcat(dst, v);
      } else {
        snprintf(dst, cap, "%s", v);
      }
    } else if (!strcmp(o, "--insecure")) {
      if (!strcmp(v, "clients")) c->insecure_clients = true;
      else if (!strcmp(v, "workers")) c->insecure_workers = true;
      else
        return mbd_error_set(err, MBD_E_INVALID, "--insecure takes clients or workers (got '%s')", v);
    } else if (!strcmp(o, "--ipc-group")) {
      if (!v[0] || strlen(v) >= sizeof c->ipc_group)
        return mbd_error_set(err, MBD_E_INVALID, "--ipc-group: '%s' is not a group name or id", v);
      snprintf(c->ipc_group, sizeof c->ipc_group, "%s", v);
    } else if (!strcmp(o, "--client-inflight")) {
      if (!(rc = parse_int(o, v, 1, 10000000, &x, err))) c->client_inflight = (int)x;
    } else if (!strcmp(o, "--reclaim-grace-ms")) {
      if (!(rc = parse_int(o, v, 0, 86400000, &x, err))) c->reclaim_grace_ms = (int)x;
    } else if (!strcmp(o, "--durable-mb")) {
      if (!(rc = parse_int(o, v, 0, 1 << 24, &x, err))) c->durable_mb = x;
    } else if (!strcmp(o, "--hwm")) {
      if (!(rc = parse_int(o, v, 1, 10000000, &x, err))) c->hwm = (int)x;
    } else {
      return mbd_error_set(err, MBD_E_INVALID, "unknown option '%s' (see --help)", o);
    }
    if (rc) return rc;
  }
  if (!c->clients_ep[0] || !c->workers_ep[0])
    return mbd_error_set(err, MBD_E_INVALID, "both --clients EP and --workers EP are required");
  if (!strcmp(c->clients_ep, c->workers_ep))
    return mbd_error_set(err, MBD_E_INVALID, "--clients and --workers must be different endpoints");
  return MBD_OK;
}
