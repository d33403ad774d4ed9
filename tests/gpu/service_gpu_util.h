/* Shared by tests/gpu/test_service_gpu*.c: the real broker + GPU worker
 * processes through tests/integration/worker_harness.h, plus helpers to send
 * many requests at once and collect their final replies by tag, and small
 * request builders. Header-only (static functions). */
#ifndef MBD_TEST_SERVICE_GPU_UTIL_H
#define MBD_TEST_SERVICE_GPU_UTIL_H

#include <cuda_runtime_api.h>

#include "integration/worker_harness.h"

/* Number of CUDA devices (0 when none or no driver). */
static inline int sg_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/* Exits 77 with a reason when fewer than `need` devices or the binaries or
 * fixtures are missing; else initialises h. */
static inline void sg_init_or_skip(wh *h, int need) {
  int n = sg_device_count();
  if (n < need) {
    printf("SKIP: %d CUDA device(s) visible, this test needs %d\n", n, need);
    exit(77);
  }
  int rc = wh_init(h);
  if (rc == 77) {
    printf("SKIP: MBD_BIN_DIR/MBD_FIXTURES_DIR, mambad-broker/-worker or the tiny fixture missing\n");
    exit(77);
  }
  if (rc) {
    printf("harness init failed\n");
    exit(1);
  }
}

/* A GPU worker on cuda:dev serving the tiny fixture in f32, deterministic. */
static inline pid_t sg_start_gpu_worker(wh *h, const char *name, int dev, const char *capacity,
                                        const char *max_batch) {
  static char devs[8][16];
  snprintf(devs[dev & 7], sizeof devs[0], "cuda:%d", dev);
  return wh_start_worker(h, name, "--device", devs[dev & 7], "--capacity", capacity,
                         "--client-sessions", capacity,
                         "--max-batch", max_batch, "--max-message-mb", "1024", NULL);
}

/* Collects the FINAL/ERROR of tags [t0, t0+n) into out[] (PARTIALs dropped).
 * Returns the number still missing after timeout_ms. */
static inline size_t sg_collect(wh *h, uint64_t t0, size_t n, mbd_msg **out, int timeout_ms) {
  size_t got = 0;
  for (size_t i = 0; i < n; i++) got += out[i] != NULL;
  double end = wh_now() + timeout_ms / 1000.0;
  while (got < n && wh_now() < end) {
    mbd_msg *m = wh_recv(h, 200);
    if (!m) continue;
    uint64_t tag = mbd_msg_tag(m);
    if (tag < t0 || tag >= t0 + n || mbd_msg_cmd(m) == MBD_CMD_PARTIAL || out[tag - t0]) {
      mbd_msg_destroy(&m);
      continue;
    }
    out[tag - t0] = m;
    got++;
  }
  return n - got;
}

static inline void sg_free_all(mbd_msg **m, size_t n) {
  for (size_t i = 0; i < n; i++) mbd_msg_destroy(&m[i]);
}

static inline uint64_t sg_send_export(wh *h, const char *sid) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 1);
  mbd_pack_kv_str(&k.pk, "session", sid);
  return wh_send(h, MBD_CMD_EXPORT, &k.sb, 0, NULL, NULL);
}

static inline uint64_t sg_send_open(wh *h) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  return wh_send(h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
}

/* IMPORT of an exported blob under its exact route id. */
static inline uint64_t sg_send_import(wh *h, const void *blob, size_t n, const char *route_id) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_str(&k.pk, "route");
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", route_id);
  mbd_pack_route_want(&k.pk, &want);
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  int64_t s[1] = {(int64_t)(n / 8)};
  wh_ref(&k.pk, "state", "i64", 1, s, 0);
  const void *pl[1] = {blob};
  size_t lens[1] = {n};
  return wh_send(h, MBD_CMD_IMPORT, &k.sb, 1, pl, lens);
}

/* Copy of the first payload of m (caller frees); *n its length. */
static inline uint8_t *sg_payload(const mbd_msg *m, size_t *n) {
  *n = 0;
  const void *p = wh_tensor(m, n);
  uint8_t *c = malloc(*n ? *n : 1);
  if (*n) memcpy(c, p, *n);
  return c;
}

static inline uint64_t sg_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

#endif
