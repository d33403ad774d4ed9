/* Fuzz target: the route identity encoding a worker's READY carries
 * (common/route.h). An accepted encoding names known enums and NUL-terminated
 * strings, and re-encoding it decodes to the same identity: the route id the
 * broker computes from it is well defined. */
#include <string.h>

#include "common/route.h"
#include "mbd_fuzz.h"

static int same(const mbd_route_identity *a, const mbd_route_identity *b) {
  return a->mode == b->mode && a->policy == b->policy && a->state == b->state &&
         a->family == b->family && a->backend == b->backend && !strcmp(a->isa, b->isa) &&
         !strcmp(a->kernel_digest, b->kernel_digest) && !strcmp(a->compiler, b->compiler) &&
         !strcmp(a->device_name, b->device_name) && a->cc_major == b->cc_major &&
         a->cc_minor == b->cc_minor && a->sm_count == b->sm_count &&
         !strcmp(a->libraries, b->libraries) && a->dispatch_rev == b->dispatch_rev &&
         a->decode == b->decode && a->state_capacity == b->state_capacity;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_route_identity r;
  mbd_error err = {0};
  int rc = mbd_route_decode((const char *)data, size, &r, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.msg[0]);
    return 0;
  }
  MBD_FUZZ_CHECK(memchr(r.isa, 0, sizeof r.isa) && memchr(r.compiler, 0, sizeof r.compiler));
  MBD_FUZZ_CHECK(memchr(r.kernel_digest, 0, sizeof r.kernel_digest));
  MBD_FUZZ_CHECK(memchr(r.device_name, 0, sizeof r.device_name));
  MBD_FUZZ_CHECK(memchr(r.libraries, 0, sizeof r.libraries));
  MBD_FUZZ_CHECK(mbd_gemm_mode_name(r.mode) && mbd_dtype_policy_name(r.policy));
  char buf[1024];
  size_t len = 0;
  MBD_FUZZ_CHECK(mbd_route_encode(&r, buf, sizeof buf, &len, NULL) == 0);
  mbd_route_identity back;
  MBD_FUZZ_CHECK(mbd_route_decode(buf, len, &back, NULL) == 0 && same(&r, &back));
  char id[65];
  mbd_route_id_hex(&r, id);
  MBD_FUZZ_CHECK(strlen(id) == 64);
  return 0;
}

/* Seeds: the encodings of a CPU and a CUDA identity. */
size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static char enc[2][1024];
  static mbd_fuzz_seed seeds[2];
  mbd_route_identity r;
  memset(&r, 0, sizeof r);
  r.mode = MBD_GEMM_DETERMINISTIC;
  r.policy = MBD_POLICY_F32;
  r.backend = MBD_BACKEND_CPU;
  strcpy(r.isa, "x86-64-v3");
  memset(r.kernel_digest, 'a', 64);
  strcpy(r.compiler, "gcc 12.2.0");
  strcpy(r.device_name, "cpu");
  r.state_capacity = 64;
  for (int k = 0; k < 2; k++) {
    if (k == 1) {
      r.backend = MBD_BACKEND_CUDA;
      r.policy = MBD_POLICY_BF16;
      strcpy(r.isa, "sm_90a");
      strcpy(r.device_name, "NVIDIA H200");
      r.cc_major = 9;
      r.sm_count = 132;
    }
    size_t len = 0;
    MBD_FUZZ_CHECK(mbd_route_encode(&r, enc[k], sizeof enc[k], &len, NULL) == 0);
    seeds[k] = (mbd_fuzz_seed){(const uint8_t *)enc[k], len};
  }
  *out = seeds;
  return 2;
}
