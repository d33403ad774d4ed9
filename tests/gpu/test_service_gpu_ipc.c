/* CUDA IPC tensors through the service (real broker + mambad-worker
 * --device cuda:0; this test process is the client and owns the device
 * memory):
 *  - FORWARD with IPC input ids and an IPC logits output, and GEMM with IPC
 *    inputs (with an IPC event), give the same bits as inline frames;
 *  - bad handles (random bytes), offsets past the end, sizes that overflow
 *    the allocation, freed allocations and a missing host_id each give an
 *    ERROR, and after each one the worker still serves correctly.
 * Exits 77 with a reason when no CUDA device is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "client/mambad.h"
#include "support/service_gpu.h"

static wh g_h;
static char g_host[128];
static const int64_t V = 512, B = 2, T = 9;
static int64_t g_ids[2 * 9];
static uint8_t *g_want; /* inline FORWARD logits [B,T,V] */
static size_t g_nwant;

/* FORWARD whose input and (optional) output are the given refs. */
static mbd_msg *forward_refs(const mbd_tensor_ref *in, const mbd_tensor_ref *out, bool host) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3 + (out != NULL) + host);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_kv_bool(&p.pk, "last_only", false);
  if (host) mbd_pack_kv_str(&p.pk, "host_id", g_host);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  mbd_pack_tensor_ref(&p.pk, in);
  if (out) {
    mbd_pack_str(&p.pk, "outputs");
    msgpack_pack_array(&p.pk, 1);
    mbd_pack_tensor_ref(&p.pk, out);
  }
  return wh_call(&g_h, MBD_CMD_FORWARD, &p.sb, 0, NULL, NULL);
}

/* The worker still serves: an inline forward gives the reference bits. */
static void assert_still_serving(void) {
  mbd_msg *m = wh_wait(&g_h, wh_send_forward(&g_h, g_ids, B, T, false), 30000);
  assert_int_equal(wh_code(m), 0);
  size_t n = 0;
  const void *p = wh_tensor(m, &n);
  assert_int_equal(n, g_nwant);
  assert_memory_equal(p, g_want, n);
  mbd_msg_destroy(&m);
}

static int setup(void **st) {
  (void)st;
  sg_init_or_skip(&g_h, 1);
  mbd_client_host_id(g_host, sizeof g_host);
  wh_start_broker(&g_h);
  sg_start_gpu_worker(&g_h, "gpu0", 0, "64", "64");
  if (wh_wait_workers(&g_h, 1, 60000)) return -1;
  uint64_t s = 9;
  for (int i = 0; i < B * T; i++) g_ids[i] = (int64_t)(sg_rng(&s) % (uint64_t)V);
  mbd_msg *m = wh_wait(&g_h, wh_send_forward(&g_h, g_ids, B, T, false), 30000);
  if (wh_code(m)) return -1;
  g_want = sg_payload(m, &g_nwant);
  mbd_msg_destroy(&m);
  return 0;
}

static int teardown(void **st) {
  (void)st;
  free(g_want);
  wh_fini(&g_h);
  return 0;
}

static void ids_desc(mbd_tensor_desc *d) {
  int64_t sh[2] = {B, T};
  mbd_tensor_desc_make(d, MBD_DTYPE_I64, 2, sh, NULL);
}

static void test_forward_ipc_equals_inline(void **st) {
  (void)st;
  /* ids at offset 256 of a 4 KiB allocation; logits into a second one. */
  void *din = NULL, *dout = NULL;
  size_t nlog = (size_t)(B * T * V) * 4;
  assert_int_equal(cudaMalloc(&din, 4096), cudaSuccess);
  assert_int_equal(cudaMalloc(&dout, nlog + 512), cudaSuccess);
  assert_int_equal(cudaMemcpy((char *)din + 256, g_ids, sizeof g_ids, cudaMemcpyHostToDevice),
                   cudaSuccess);
  assert_int_equal(cudaMemset(dout, 0xff, nlog + 512), cudaSuccess);
  cudaEvent_t ev;
  assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming),
                   cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, 0), cudaSuccess);
  mbd_tensor_desc d, ld;
  ids_desc(&d);
  int64_t ls[3] = {B, T, V};
  mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 3, ls, NULL);
  mbd_tensor_ref in, out;
  mbd_error e = {0};
  assert_int_equal(mbd_cuda_ipc_ref(din, 4096, 256, &d, "input_ids", ev, &in, &e), 0);
  assert_int_equal(mbd_cuda_ipc_ref(dout, nlog + 512, 512, &ld, "logits", NULL, &out, &e), 0);
  for (int rep = 0; rep < 3; rep++) { /* first opens the handles, then cached */
    double t0 = wh_now();
    mbd_msg *m = forward_refs(&in, &out, true);
    double dt = wh_now() - t0;
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    uint8_t *got = malloc(nlog);
    assert_int_equal(cudaMemcpy(got, (char *)dout + 512, nlog, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    assert_memory_equal(got, g_want, nlog);
    free(got);
    printf("IPC forward round trip %d: %.3f ms\n", rep, dt * 1e3);
  }
  /* Nothing outside [512, 512 + nlog) of the output was written. */
  uint8_t guard[512];
  assert_int_equal(cudaMemcpy(guard, dout, 512, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 512; i++) assert_int_equal(guard[i], 0xff);
  /* IPC input, inline output. */
  mbd_msg *m = forward_refs(&in, NULL, true);
  assert_int_equal(wh_code(m), 0);
  size_t n = 0;
  const void *p = wh_tensor(m, &n);
  assert_int_equal(n, g_nwant);
  assert_memory_equal(p, g_want, n);
  mbd_msg_destroy(&m);
  cudaEventDestroy(ev);
  cudaFree(din);
  cudaFree(dout);
}

static void test_gemm_ipc_equals_inline(void **st) {
  (void)st;
  const int64_t M = 37, N = 29, K = 70;
  float *a = malloc((size_t)(M * K) * 4), *b = malloc((size_t)(N * K) * 4);
  uint64_t s = 5;
  for (int64_t i = 0; i < M * K; i++) a[i] = (float)((int64_t)(sg_rng(&s) % 2001) - 1000) / 997.f;
  for (int64_t i = 0; i < N * K; i++) b[i] = (float)((int64_t)(sg_rng(&s) % 2001) - 1000) / 991.f;
  int64_t as[2] = {M, K}, bs[2] = {N, K};
  /* inline */
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 2);
  wh_ref(&p.pk, "a", "f32", 2, as, 0);
  wh_ref(&p.pk, "b", "f32", 2, bs, 1);
  const void *pl[2] = {a, b};
  size_t lens[2] = {(size_t)(M * K) * 4, (size_t)(N * K) * 4};
  mbd_msg *mi = wh_call(&g_h, MBD_CMD_GEMM, &p.sb, 2, pl, lens);
  assert_int_equal(wh_code(mi), 0);
  /* IPC: both in one allocation */
  void *dmem = NULL;
  size_t tot = lens[0] + lens[1];
  assert_int_equal(cudaMalloc(&dmem, tot), cudaSuccess);
  cudaMemcpy(dmem, a, lens[0], cudaMemcpyHostToDevice);
  cudaMemcpy((char *)dmem + lens[0], b, lens[1], cudaMemcpyHostToDevice);
  mbd_tensor_desc ad, bd;
  mbd_tensor_desc_make(&ad, MBD_DTYPE_F32, 2, as, NULL);
  mbd_tensor_desc_make(&bd, MBD_DTYPE_F32, 2, bs, NULL);
  mbd_tensor_ref ra, rb;
  mbd_error e = {0};
  assert_int_equal(mbd_cuda_ipc_ref(dmem, tot, 0, &ad, "a", NULL, &ra, &e), 0);
  assert_int_equal(mbd_cuda_ipc_ref(dmem, tot, lens[0], &bd, "b", NULL, &rb, &e), 0);
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "host_id", g_host);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 2);
  mbd_pack_tensor_ref(&p.pk, &ra);
  mbd_pack_tensor_ref(&p.pk, &rb);
  mbd_msg *mp = wh_call(&g_h, MBD_CMD_GEMM, &p.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(mp), 0);
  size_t n1 = 0, n2 = 0;
  const void *p1 = wh_tensor(mi, &n1), *p2 = wh_tensor(mp, &n2);
  assert_int_equal(n1, (size_t)(M * N) * 4);
  assert_int_equal(n1, n2);
  assert_memory_equal(p1, p2, n1);
  mbd_msg_destroy(&mi);
  mbd_msg_destroy(&mp);
  cudaFree(dmem);
  free(a);
  free(b);
}

/* Sends a forward with a doctored input ref; expects ERROR `want_code`
 * (0 = any error), then checks the worker still serves. */
static void expect_error(const mbd_tensor_ref *in, bool host, int want_code, const char *what) {
  mbd_msg *m = forward_refs(in, NULL, host);
  assert_non_null(m);
  int code = wh_code(m);
  printf("%s -> code %d\n", what, code);
  assert_int_not_equal(code, 0);
  if (want_code) assert_int_equal(code, want_code);
  mbd_msg_destroy(&m);
  assert_still_serving();
}

static void test_bad_refs_fail_cleanly(void **st) {
  (void)st;
  /* 2 MiB: a whole allocation granule, so the allocation the worker sees
   * (cuMemGetAddressRange) ends exactly where the client's does. */
  const size_t A = (size_t)2 << 20;
  void *din = NULL;
  assert_int_equal(cudaMalloc(&din, A), cudaSuccess);
  cudaMemcpy(din, g_ids, sizeof g_ids, cudaMemcpyHostToDevice);
  mbd_tensor_desc d;
  ids_desc(&d);
  mbd_tensor_ref good, r;
  mbd_error e = {0};
  assert_int_equal(mbd_cuda_ipc_ref(din, A, 0, &d, "input_ids", NULL, &good, &e), 0);
  /* random handle bytes */
  r = good;
  uint64_t s = 31;
  for (int i = 0; i < MBD_IPC_HANDLE_BYTES; i++) r.ipc_handle[i] = (uint8_t)sg_rng(&s);
  expect_error(&r, true, 0, "random handle bytes");
  /* offset past the end of the allocation */
  r = good;
  r.offset = A + 8;
  expect_error(&r, true, MBD_E_INVALID, "offset past the end");
  /* in range start, size running past the end */
  r = good;
  r.offset = A - 64;
  expect_error(&r, true, MBD_E_INVALID, "range past the end");
  /* size that would overflow offset + size inside the worker's check */
  r = good;
  r.offset = 8;
  r.size = UINT64_MAX - 8;
  expect_error(&r, true, 0, "overflowing size");
  r = good;
  r.offset = UINT64_MAX - 100;
  r.size = 100;
  expect_error(&r, true, 0, "overflowing offset");
  /* a freed allocation (never opened by the worker) */
  void *tmp = NULL;
  assert_int_equal(cudaMalloc(&tmp, A), cudaSuccess);
  mbd_tensor_ref freed;
  assert_int_equal(mbd_cuda_ipc_ref(tmp, A, 0, &d, "input_ids", NULL, &freed, &e), 0);
  cudaFree(tmp);
  expect_error(&freed, true, 0, "freed allocation");
  /* a foreign event handle */
  r = good;
  r.has_event = true;
  for (int i = 0; i < MBD_IPC_HANDLE_BYTES; i++) r.ipc_event[i] = (uint8_t)sg_rng(&s);
  expect_error(&r, true, 0, "random event handle");
  /* IPC without the client's host id: the broker refuses */
  expect_error(&good, false, MBD_E_INVALID, "no host_id");
  /* another host's id: no worker there */
  mbd_msg *m;
  {
    char saved[128];
    snprintf(saved, sizeof saved, "%s", g_host);
    snprintf(g_host, sizeof g_host, "some-other-host");
    m = forward_refs(&good, NULL, true);
    snprintf(g_host, sizeof g_host, "%s", saved);
  }
  assert_int_equal(wh_code(m), MBD_E_NO_ROUTE);
  mbd_msg_destroy(&m);
  /* and the good ref still works */
  m = forward_refs(&good, NULL, true);
  assert_int_equal(wh_code(m), 0);
  size_t n = 0;
  const void *p = wh_tensor(m, &n);
  assert_int_equal(n, g_nwant);
  assert_memory_equal(p, g_want, n);
  mbd_msg_destroy(&m);
  cudaFree(din);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_ipc_equals_inline),
      cmocka_unit_test(test_gemm_ipc_equals_inline),
      cmocka_unit_test(test_bad_refs_fail_cleanly),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
