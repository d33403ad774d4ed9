/* Fuzz target: the deployment YAML reader. Whatever the input, it returns an
 * error with a message or a config whose values respect the documented ranges
 * and cross-references (worker models index the catalogue). */
#include <string.h>

#include "common/defaults.h"
#include "common/deploy_config.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_deploy_config *c = NULL;
  mbd_error err = {0};
  int rc = mbd_deploy_config_parse((const char *)data, size, "fuzz.yaml", "/base", &c, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && c == NULL);
    MBD_FUZZ_CHECK(strncmp(err.msg, "fuzz.yaml:", 10) == 0 || rc == MBD_E_NOMEM);
    return 0;
  }
  MBD_FUZZ_CHECK(c != NULL);
  MBD_FUZZ_CHECK(!strncmp(c->clients_ep, "ipc://", 6) || !strncmp(c->clients_ep, "tcp://", 6));
  MBD_FUZZ_CHECK(!strncmp(c->workers_ep, "ipc://", 6) || !strncmp(c->workers_ep, "tcp://", 6));
  MBD_FUZZ_CHECK(strcmp(c->clients_ep, c->workers_ep) != 0);
  MBD_FUZZ_CHECK(c->heartbeat_ms >= 10 && c->liveness >= 1 && c->queue_limit >= 1);
  MBD_FUZZ_CHECK(c->max_message_mb >= 1 && c->default_deadline_ms >= 1);
  MBD_FUZZ_CHECK(c->durable_mb >= 0 && c->durable_mb <= MBD_DURABLE_MB_MAX);
  MBD_FUZZ_CHECK(c->checkpoint_tokens >= 0 && c->checkpoint_tokens <= MBD_DURABLE_LOG_MAX);
  MBD_FUZZ_CHECK(c->checkpoint_ms >= 0 && c->checkpoint_ms <= MBD_CHECKPOINT_MS_MAX);
  MBD_FUZZ_CHECK(c->prefix_cache.mb >= 0 && c->prefix_cache.mb <= MBD_PREFIX_CACHE_MB_MAX);
  MBD_FUZZ_CHECK(c->prefix_cache.block >= 0 && c->prefix_cache.block <= MBD_PREFIX_BLOCK_MAX);
  MBD_FUZZ_CHECK(c->n_models <= MBD_DEPLOY_MAX_MODELS && c->n_workers <= MBD_DEPLOY_MAX_WORKERS);
  for (size_t i = 0; i < c->n_models; i++) MBD_FUZZ_CHECK(c->models[i].name[0] && c->models[i].path[0]);
  for (size_t i = 0; i < c->n_workers; i++) {
    const mbd_deploy_worker *w = &c->workers[i];
    MBD_FUZZ_CHECK(w->name[0] && w->count >= 1 && w->n_models <= c->n_models);
    MBD_FUZZ_CHECK(w->count == 1 || w->device == MBD_DEPLOY_DEVICE_CPU);
    MBD_FUZZ_CHECK(w->checkpoint_tokens >= 0 && w->checkpoint_tokens <= MBD_DURABLE_LOG_MAX);
    MBD_FUZZ_CHECK(w->checkpoint_ms >= 0 && w->checkpoint_ms <= MBD_CHECKPOINT_MS_MAX);
    MBD_FUZZ_CHECK(w->prefix_cache.mb >= 0 && w->prefix_cache.mb <= MBD_PREFIX_CACHE_MB_MAX);
    MBD_FUZZ_CHECK(w->prefix_cache.block >= 0 && w->prefix_cache.block <= MBD_PREFIX_BLOCK_MAX);
    /* a worker that checkpoints has a broker that keeps checkpoints */
    MBD_FUZZ_CHECK((!w->checkpoint_tokens && !w->checkpoint_ms) || c->durable_mb > 0);
    for (size_t k = 0; k < w->n_models; k++)
      MBD_FUZZ_CHECK(w->models[k] >= 0 && (size_t)w->models[k] < c->n_models);
  }
  MBD_FUZZ_CHECK(!c->security.curve); /* curve: true is refused */
  mbd_deploy_config_free(&c);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("broker:\n  clients: ipc:///tmp/a\n  workers: tcp://*:5556\n  heartbeat_ms: 100\n"
        "  liveness: 3\nmodels:\n  - name: m\n    path: x/m\n  - {name: n, path: /abs}\n"
        "workers:\n  - name: w\n    device: cpu\n    dtype: bf16\n    gemm_mode: deterministic\n"
        "    count: 2\n    models: [m, n]\n  - {name: g, device: 'cuda:1', capacity: 4}\n"
        "security:\n  curve: false\n  server_public_key: \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"\n"),
      S("broker: {clients: 'tcp://0.0.0.0:1', workers: 'ipc:///w'}\nworkers: [{name: a, device: all}]\n"),
      S("a: &a [x, x]\nb: &b [*a, *a]\nbroker: *b\n"),
      S("broker: {clients: 'ipc:///c', workers: 'ipc:///w'}\n"
        "durable: {checkpoint_tokens: 16, checkpoint_ms: 500, budget_mb: 64}\n"
        "workers:\n  - {name: a, device: cpu}\n"
        "  - {name: b, device: 'cuda:0', checkpoint_tokens: 0, prefix_block: 64}\n"
        "prefix_cache: {mb: 512, block: 128}\n"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
