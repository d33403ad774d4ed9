/* CUDA device tensors through the service (real broker + mambad-worker
 * --device cuda:0; this test process is the client and owns the device
 * memory), sent with libmambad's mbd_tensor_device:
 *  - FORWARD with device input ids and a device logits output, GEMM with
 *    device operands (with an IPC event) and a device output, and a session's
 *    PREFILL, STEP, GENERATE and EXPORT writing into device buffers (then
 *    IMPORT from the device state) give the same bits as inline frames
 *    (memcmp), and nothing outside an output's range is written;
 *  - bad handles (random bytes), offsets past the end, sizes that overflow
 *    the allocation, freed allocations, foreign events, a missing or foreign
 *    host_id, outputs of the wrong shape or overlapping an input each give an
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
static mbd_client *g_c;
static char g_host[128];
static const int64_t V = 512, B = 2, T = 9;
static int64_t g_ids[2 * 9];
static uint8_t *g_want; /* inline FORWARD logits [B,T,V] */
static size_t g_nwant;

static void ids_desc(mbd_tensor_desc *d) {
  int64_t sh[2] = {B, T};
  mbd_tensor_desc_make(d, MBD_DTYPE_I64, 2, sh, NULL);
}

static void desc(mbd_tensor_desc *d, mbd_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  int64_t sh[3] = {d0, d1, d2};
  assert_int_equal(mbd_tensor_desc_make(d, dt, ndim, sh, NULL), 0);
}

/* p's n bytes set to byte before p is handed to the worker: cudaMemset is
 * asynchronous to the host, so unsynchronised it can land after the worker
 * has written its output through the IPC mapping. */
static void fill(void *p, int byte, size_t n) {
  assert_int_equal(cudaMemset(p, byte, n), cudaSuccess);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

/* Device bytes [off, off + n) of p, copied to a new host buffer. */
static uint8_t *down(const void *p, size_t off, size_t n) {
  uint8_t *h = malloc(n ? n : 1);
  assert_non_null(h);
  assert_int_equal(cudaMemcpy(h, (const char *)p + off, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

static void assert_device_fill(const void *p, size_t off, size_t n, uint8_t byte) {
  uint8_t *h = down(p, off, n);
  for (size_t i = 0; i < n; i++) assert_int_equal(h[i], byte);
  free(h);
}

/* The worker still serves: an inline forward gives the reference bits. */
static void assert_still_serving(void) {
  mbd_tensor_desc d;
  ids_desc(&d);
  mbd_tensor_in in = {.desc = d, .data = g_ids};
  mbd_tensor_out lo;
  mbd_error e = {0};
  assert_int_equal(mbd_client_forward(g_c, NULL, "tiny", &in, false, NULL, &lo, &e), 0);
  assert_int_equal(lo.nbytes, g_nwant);
  assert_memory_equal(lo.data, g_want, g_nwant);
  mbd_tensor_out_release(&lo);
}

static int setup(void **st) {
  (void)st;
  sg_init_or_skip(&g_h, 1);
  mbd_client_host_id(g_host, sizeof g_host);
  wh_start_broker(&g_h);
  sg_start_gpu_worker(&g_h, "gpu0", 0, "64", "64");
  if (wh_wait_workers(&g_h, 1, 60000)) return -1;
  mbd_error e = {0};
  if (mbd_client_new(g_h.clients, NULL, &g_c, &e)) return -1;
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
  mbd_client_destroy(&g_c);
  free(g_want);
  wh_fini(&g_h);
  return 0;
}

static void test_forward_device_equals_inline(void **st) {
  (void)st;
  /* ids at offset 256 of a 4 KiB allocation; logits at 512 of a second one. */
  void *din = NULL, *dout = NULL;
  size_t nlog = (size_t)(B * T * V) * 4;
  assert_int_equal(cudaMalloc(&din, 4096), cudaSuccess);
  assert_int_equal(cudaMalloc(&dout, nlog + 1024), cudaSuccess);
  assert_int_equal(cudaMemcpy((char *)din + 256, g_ids, sizeof g_ids, cudaMemcpyHostToDevice),
                   cudaSuccess);
  fill(dout, 0xff, nlog + 1024);
  cudaEvent_t ev;
  assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming),
                   cudaSuccess);
  mbd_tensor_desc d, ld;
  ids_desc(&d);
  desc(&ld, MBD_DTYPE_F32, 3, B, T, V);
  mbd_tensor_in in, out;
  mbd_error e = {0};
  assert_int_equal(mbd_tensor_device((char *)din + 256, &d, ev, &in, &e), 0);
  assert_int_equal(mbd_tensor_device((char *)dout + 512, &ld, NULL, &out, &e), 0);
  mbd_call_opts o = {.output = &out};
  for (int rep = 0; rep < 3; rep++) { /* first opens the handles, then cached */
    assert_int_equal(cudaEventRecord(ev, 0), cudaSuccess);
    mbd_tensor_out lo;
    double t0 = wh_now();
    int rc = mbd_client_forward(g_c, &o, "tiny", &in, false, NULL, &lo, &e);
    double dt = wh_now() - t0;
    if (rc) printf("forward: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_true(lo.on_device);
    assert_ptr_equal(lo.data, (char *)dout + 512);
    assert_int_equal(lo.nbytes, nlog);
    mbd_tensor_out_release(&lo);
    uint8_t *got = down(dout, 512, nlog); /* the reply came after the worker's writes */
    assert_memory_equal(got, g_want, nlog);
    free(got);
    printf("device forward round trip %d: %.3f ms\n", rep, dt * 1e3);
  }
  /* Nothing outside [512, 512 + nlog) of the output was written. */
  assert_device_fill(dout, 0, 512, 0xff);
  assert_device_fill(dout, 512 + nlog, 512, 0xff);
  /* Device input, inline output. */
  mbd_tensor_out lo;
  assert_int_equal(mbd_client_forward(g_c, NULL, "tiny", &in, false, NULL, &lo, &e), 0);
  assert_false(lo.on_device);
  assert_int_equal(lo.nbytes, g_nwant);
  assert_memory_equal(lo.data, g_want, g_nwant);
  mbd_tensor_out_release(&lo);
  /* last_only into a device [B,V] output. */
  mbd_tensor_desc l2;
  desc(&l2, MBD_DTYPE_F32, 2, B, V, 0);
  mbd_tensor_in out2;
  assert_int_equal(mbd_tensor_device(dout, &l2, NULL, &out2, &e), 0);
  o.output = &out2;
  assert_int_equal(mbd_client_forward(g_c, &o, "tiny", &in, true, NULL, &lo, &e), 0);
  uint8_t *got = down(dout, 0, (size_t)(B * V) * 4);
  for (int64_t b = 0; b < B; b++)
    assert_memory_equal(got + (size_t)(b * V) * 4, g_want + ((size_t)(b * T + T - 1) * V) * 4,
                        (size_t)V * 4);
  free(got);
  mbd_tensor_out_release(&lo);
  cudaEventDestroy(ev);
  cudaFree(din);
  cudaFree(dout);
}

static void test_gemm_device_equals_inline(void **st) {
  (void)st;
  const int64_t M = 37, N = 29, K = 70;
  size_t na = (size_t)(M * K) * 4, nb = (size_t)(N * K) * 4, nc = (size_t)(M * N) * 4;
  float *a = malloc(na), *b = malloc(nb), *bias = malloc((size_t)N * 4);
  uint64_t s = 5;
  for (int64_t i = 0; i < M * K; i++) a[i] = (float)((int64_t)(sg_rng(&s) % 2001) - 1000) / 997.f;
  for (int64_t i = 0; i < N * K; i++) b[i] = (float)((int64_t)(sg_rng(&s) % 2001) - 1000) / 991.f;
  for (int64_t i = 0; i < N; i++) bias[i] = (float)i / 7.f;
  mbd_tensor_desc ad, bd, cd, biasd;
  desc(&ad, MBD_DTYPE_F32, 2, M, K, 0);
  desc(&bd, MBD_DTYPE_F32, 2, N, K, 0);
  desc(&cd, MBD_DTYPE_F32, 2, M, N, 0);
  desc(&biasd, MBD_DTYPE_F32, 1, N, 0, 0);
  mbd_error e = {0};
  /* inline */
  mbd_tensor_in ha = {.desc = ad, .data = a}, hb = {.desc = bd, .data = b},
                hbias = {.desc = biasd, .data = bias};
  mbd_tensor_out want, want_bias;
  assert_int_equal(mbd_client_gemm(g_c, NULL, "f32", &ha, &hb, NULL, &want, &e), 0);
  assert_int_equal(mbd_client_gemm(g_c, NULL, "f32", &ha, &hb, &hbias, &want_bias, &e), 0);
  assert_int_equal(want.nbytes, nc);
  /* device: a, b, bias in one allocation (written on a stream, ordered by
   * the event); c at offset 256 of another */
  void *dmem = NULL, *dc = NULL;
  size_t tot = na + nb + (size_t)N * 4;
  assert_int_equal(cudaMalloc(&dmem, tot), cudaSuccess);
  assert_int_equal(cudaMalloc(&dc, nc + 512), cudaSuccess);
  cudaStream_t cs;
  cudaEvent_t ev;
  assert_int_equal(cudaStreamCreate(&cs), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming),
                   cudaSuccess);
  cudaMemcpyAsync(dmem, a, na, cudaMemcpyHostToDevice, cs);
  cudaMemcpyAsync((char *)dmem + na, b, nb, cudaMemcpyHostToDevice, cs);
  cudaMemcpyAsync((char *)dmem + na + nb, bias, (size_t)N * 4, cudaMemcpyHostToDevice, cs);
  assert_int_equal(cudaEventRecord(ev, cs), cudaSuccess);
  fill(dc, 0xff, nc + 512);
  mbd_tensor_in da, db, dbias, dout;
  assert_int_equal(mbd_tensor_device(dmem, &ad, ev, &da, &e), 0);
  assert_int_equal(mbd_tensor_device((char *)dmem + na, &bd, NULL, &db, &e), 0);
  assert_int_equal(mbd_tensor_device((char *)dmem + na + nb, &biasd, NULL, &dbias, &e), 0);
  assert_int_equal(mbd_tensor_device((char *)dc + 256, &cd, NULL, &dout, &e), 0);
  mbd_call_opts o = {.output = &dout};
  mbd_tensor_out got;
  int rc = mbd_client_gemm(g_c, &o, "f32", &da, &db, NULL, &got, &e);
  if (rc) printf("gemm: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_true(got.on_device);
  mbd_tensor_out_release(&got);
  uint8_t *h = down(dc, 256, nc);
  assert_memory_equal(h, want.data, nc);
  free(h);
  assert_device_fill(dc, 0, 256, 0xff);
  assert_device_fill(dc, 256 + nc, 256, 0xff);
  /* device inputs with a bias, inline output */
  assert_int_equal(mbd_client_gemm(g_c, NULL, "f32", &da, &db, &dbias, &got, &e), 0);
  assert_false(got.on_device);
  assert_int_equal(got.nbytes, nc);
  assert_memory_equal(got.data, want_bias.data, nc);
  mbd_tensor_out_release(&got);
  /* host inputs, device output */
  assert_int_equal(mbd_client_gemm(g_c, &o, "f32", &ha, &hb, NULL, &got, &e), 0);
  h = down(dc, 256, nc);
  assert_memory_equal(h, want.data, nc);
  free(h);
  mbd_tensor_out_release(&got);
  /* an output overlapping an input of the same allocation is refused */
  mbd_tensor_in bad;
  assert_int_equal(mbd_tensor_device((char *)dmem + na, &cd, NULL, &bad, &e), 0);
  o.output = &bad;
  assert_int_equal(mbd_client_gemm(g_c, &o, "f32", &da, &db, NULL, &got, &e), MBD_E_INVALID);
  printf("overlapping output -> %s\n", e.msg);
  assert_still_serving();
  /* an output of the wrong shape is refused */
  mbd_tensor_desc wrong;
  desc(&wrong, MBD_DTYPE_F32, 2, N, M, 0);
  assert_int_equal(mbd_tensor_device((char *)dc + 256, &wrong, NULL, &bad, &e), 0);
  assert_int_equal(mbd_client_gemm(g_c, &o, "f32", &da, &db, NULL, &got, &e), MBD_E_SHAPE);
  assert_still_serving();
  mbd_tensor_out_release(&want);
  mbd_tensor_out_release(&want_bias);
  cudaEventDestroy(ev);
  cudaStreamDestroy(cs);
  cudaFree(dmem);
  cudaFree(dc);
  free(a);
  free(b);
  free(bias);
}

/* One session fed inline and one fed from and into device memory see the
 * same tokens; every result (PREFILL logits, STEP logits, GENERATE tokens,
 * EXPORT state) is equal by memcmp, and a session imported from the device
 * state continues with the same bits. */
static void test_session_device_equals_inline(void **st) {
  (void)st;
  const int64_t P = 11, G = 8;
  int64_t ids[11];
  uint64_t s = 77;
  for (int64_t i = 0; i < P; i++) ids[i] = (int64_t)(sg_rng(&s) % (uint64_t)V);
  mbd_error e = {0};
  mbd_session *sa = NULL, *sb = NULL, *sc = NULL;
  assert_int_equal(mbd_session_open(g_c, NULL, "tiny", &sa, &e), 0);
  assert_int_equal(mbd_session_open(g_c, NULL, "tiny", &sb, &e), 0);
  mbd_tensor_desc idd, pld, sld, gd;
  desc(&idd, MBD_DTYPE_I64, 1, P, 0, 0);
  desc(&pld, MBD_DTYPE_F32, 2, P, V, 0);
  desc(&sld, MBD_DTYPE_F32, 1, V, 0, 0);
  desc(&gd, MBD_DTYPE_I64, 1, G, 0, 0);
  /* device buffers: ids | prefill logits | step logits | tokens, one allocation each */
  void *dids = NULL, *dpl = NULL, *dsl = NULL, *dtok = NULL, *dstate = NULL;
  assert_int_equal(cudaMalloc(&dids, sizeof ids), cudaSuccess);
  assert_int_equal(cudaMalloc(&dpl, (size_t)(P * V) * 4), cudaSuccess);
  assert_int_equal(cudaMalloc(&dsl, (size_t)V * 4), cudaSuccess);
  assert_int_equal(cudaMalloc(&dtok, (size_t)G * 8), cudaSuccess);
  assert_int_equal(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice), cudaSuccess);
  mbd_tensor_in hin = {.desc = idd, .data = ids}, din, dpo, dso, dgo;
  assert_int_equal(mbd_tensor_device(dids, &idd, NULL, &din, &e), 0);
  assert_int_equal(mbd_tensor_device(dpl, &pld, NULL, &dpo, &e), 0);
  assert_int_equal(mbd_tensor_device(dsl, &sld, NULL, &dso, &e), 0);
  assert_int_equal(mbd_tensor_device(dtok, &gd, NULL, &dgo, &e), 0);
  /* PREFILL */
  mbd_tensor_out la, lb;
  assert_int_equal(mbd_session_prefill(sa, NULL, &hin, false, &la, &e), 0);
  mbd_call_opts o = {.output = &dpo};
  int rc = mbd_session_prefill(sb, &o, &din, false, &lb, &e);
  if (rc) printf("prefill: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_true(lb.on_device);
  uint8_t *h = down(dpl, 0, la.nbytes);
  assert_memory_equal(h, la.data, la.nbytes);
  free(h);
  mbd_tensor_out_release(&la);
  mbd_tensor_out_release(&lb);
  /* STEP */
  o.output = &dso;
  for (int k = 0; k < 3; k++) {
    int64_t tok = (int64_t)(sg_rng(&s) % (uint64_t)V);
    assert_int_equal(mbd_session_step(sa, NULL, tok, &la, &e), 0);
    rc = mbd_session_step(sb, &o, tok, &lb, &e);
    if (rc) printf("step: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_true(lb.on_device);
    h = down(dsl, 0, (size_t)V * 4);
    assert_memory_equal(h, la.data, (size_t)V * 4);
    free(h);
    mbd_tensor_out_release(&la);
    mbd_tensor_out_release(&lb);
  }
  /* GENERATE (greedy) */
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = G;
  int64_t *ta = NULL, *tb = NULL;
  size_t na = 0, nb = 0;
  char ra[16], rb[16];
  assert_int_equal(mbd_session_generate(sa, NULL, &gp, NULL, NULL, &ta, &na, ra, &e), 0);
  o.output = &dgo;
  rc = mbd_session_generate(sb, &o, &gp, NULL, NULL, &tb, &nb, rb, &e);
  if (rc) printf("generate: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(na, (size_t)G);
  assert_int_equal(nb, na);
  assert_memory_equal(ta, tb, na * 8);
  h = down(dtok, 0, na * 8);
  assert_memory_equal(h, ta, na * 8);
  free(h);
  free(ta);
  free(tb);
  /* EXPORT: inline vs into device memory, same bytes */
  mbd_session_state *xa = NULL, *xb = NULL;
  assert_int_equal(mbd_session_export(sa, NULL, &xa, &e), 0);
  size_t nstate = xa->tensors[0].nbytes;
  assert_int_equal(cudaMalloc(&dstate, nstate + 4096), cudaSuccess);
  fill(dstate, 0xee, nstate + 4096);
  mbd_tensor_desc xd;
  desc(&xd, MBD_DTYPE_I64, 1, (int64_t)(nstate + 4096) / 8, 0, 0);
  mbd_tensor_in dxo;
  assert_int_equal(mbd_tensor_device(dstate, &xd, NULL, &dxo, &e), 0);
  o.output = &dxo;
  rc = mbd_session_export(sb, &o, &xb, &e);
  if (rc) printf("export: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_true(xb->tensors[0].on_device);
  assert_int_equal(xb->tensors[0].nbytes, nstate);
  h = down(dstate, 0, nstate);
  assert_memory_equal(h, xa->tensors[0].data, nstate);
  free(h);
  assert_device_fill(dstate, nstate, 4096, 0xee);
  /* IMPORT from the device state, then one more step on both: same bits */
  rc = mbd_session_import(g_c, NULL, xb, &sc, &e);
  if (rc) printf("import: %s\n", e.msg);
  assert_int_equal(rc, 0);
  int64_t tok = 3;
  assert_int_equal(mbd_session_step(sa, NULL, tok, &la, &e), 0);
  assert_int_equal(mbd_session_step(sc, NULL, tok, &lb, &e), 0);
  assert_int_equal(la.nbytes, lb.nbytes);
  assert_memory_equal(la.data, lb.data, la.nbytes);
  mbd_tensor_out_release(&la);
  mbd_tensor_out_release(&lb);
  /* a device output of the wrong shape fails the STEP, the session goes on */
  mbd_tensor_in wrong;
  assert_int_equal(mbd_tensor_device(dpl, &pld, NULL, &wrong, &e), 0);
  o.output = &wrong;
  assert_int_equal(mbd_session_step(sb, &o, tok, &lb, &e), MBD_E_SHAPE);
  mbd_session_state_free(&xa);
  mbd_session_state_free(&xb);
  assert_int_equal(mbd_session_close(&sa, &e), 0);
  assert_int_equal(mbd_session_close(&sb, &e), 0);
  assert_int_equal(mbd_session_close(&sc, &e), 0);
  cudaFree(dids);
  cudaFree(dpl);
  cudaFree(dsl);
  cudaFree(dtok);
  cudaFree(dstate);
}

/* FORWARD whose input is the given (hand-made) ref: the matrix below edits
 * refs field by field, which mbd_tensor_device would never produce. */
static mbd_msg *forward_ref(const mbd_tensor_ref *in, bool host) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3 + host);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_kv_bool(&p.pk, "last_only", false);
  if (host) mbd_pack_kv_str(&p.pk, "host_id", g_host);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  mbd_pack_tensor_ref(&p.pk, in);
  return wh_call(&g_h, MBD_CMD_FORWARD, &p.sb, 0, NULL, NULL);
}

/* Sends a forward with a doctored input ref; expects ERROR `want_code`
 * (0 = any error), then checks the worker still serves. */
static void expect_error(const mbd_tensor_ref *in, bool host, int want_code, const char *what) {
  mbd_msg *m = forward_ref(in, host);
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
  /* a misaligned offset for i64 elements */
  r = good;
  r.offset = 4;
  expect_error(&r, true, MBD_E_INVALID, "misaligned offset");
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
    m = forward_ref(&good, true);
    snprintf(g_host, sizeof g_host, "%s", saved);
  }
  assert_int_equal(wh_code(m), MBD_E_NO_ROUTE);
  mbd_msg_destroy(&m);
  /* and the good ref still works */
  m = forward_ref(&good, true);
  assert_int_equal(wh_code(m), 0);
  size_t n = 0;
  const void *p = wh_tensor(m, &n);
  assert_int_equal(n, g_nwant);
  assert_memory_equal(p, g_want, n);
  mbd_msg_destroy(&m);
  /* libmambad refuses host memory and ranges past the allocation itself */
  mbd_tensor_in t;
  assert_int_equal(mbd_tensor_device(g_ids, &d, NULL, &t, &e), MBD_E_INVALID);
  assert_int_equal(mbd_tensor_device((char *)din + A - 64, &d, NULL, &t, &e), MBD_E_INVALID);
  cudaFree(din);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_device_equals_inline),
      cmocka_unit_test(test_gemm_device_equals_inline),
      cmocka_unit_test(test_session_device_equals_inline),
      cmocka_unit_test(test_bad_refs_fail_cleanly),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
