/* GPU workers under the worker harness (see service_gpu.h). */
#include "support/service_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "support/gpu_util.h"

int sg_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void sg_init_or_skip(wh *h, int need) {
  int n = sg_device_count();
  if (n < need) {
    printf("SKIP: %d CUDA device(s) visible, this test needs %d\n", n, need);
    exit(77);
  }
  int rc = wh_init(h);
  if (rc == 77) {
    printf(
        "SKIP: MBD_BIN_DIR/MBD_FIXTURES_DIR, mambad-broker/-worker or the tiny fixture missing\n");
    exit(77);
  }
  if (rc) {
    printf("harness init failed\n");
    exit(1);
  }
}

pid_t sg_start_gpu_worker(wh *h, const char *name, int dev, const char *capacity,
                          const char *max_batch) {
  static char devs[8][16];
  snprintf(devs[dev & 7], sizeof devs[0], "cuda:%d", dev);
  return wh_start_worker(h, name, "--device", devs[dev & 7], "--capacity", capacity,
                         "--client-sessions", capacity, "--max-batch", max_batch,
                         "--max-message-mb", "1024", NULL);
}

uint64_t sg_send_export(wh *h, const char *sid) { return wh_send_export(h, sid); }

uint64_t sg_send_import(wh *h, const void *blob, size_t n, const char *route_id) {
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", route_id);
  return wh_send_import(h, blob, n, &want);
}

uint8_t *sg_payload(const mbd_msg *m, size_t *n) {
  *n = 0;
  const void *p = wh_tensor(m, n);
  uint8_t *c = malloc(*n ? *n : 1);
  if (*n) memcpy(c, p, *n);
  return c;
}

uint64_t sg_rng(uint64_t *s) { return gpu_test_rng(s); }
