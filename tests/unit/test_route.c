/* Route identity: name parsers, golden encodings and ids (fixed identities
 * whose canonical bytes and SHA-256 are spelled out, so any drift in the
 * encoding or the id fails), round trip, id stability and sensitivity to
 * every field, decode errors, constraint matching. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/route.h"
#include "common/sha256.h"

static mbd_route_identity sample(void) {
  mbd_route_identity r;
  memset(&r, 0, sizeof r);
  r.mode = MBD_GEMM_CUBLAS_PEDANTIC;
  r.policy = MBD_POLICY_BF16;
  r.state = MBD_STATE_BF16;
  r.family = MBD_FAMILY_TRIAD;
  r.backend = MBD_BACKEND_CUDA;
  snprintf(r.isa, sizeof r.isa, "sm_90a");
  snprintf(r.kernel_digest, sizeof r.kernel_digest, "%064x", 0xabc);
  snprintf(r.compiler, sizeof r.compiler, "nvcc 12.8 / gcc 12.2");
  snprintf(r.device_name, sizeof r.device_name, "NVIDIA H200");
  r.cc_major = 9;
  r.cc_minor = 0;
  r.sm_count = 132;
  snprintf(r.libraries, sizeof r.libraries, "cublas 12.8.4");
  r.dispatch_rev = 3;
  r.decode = MBD_DECODE_PERSISTENT;
  r.state_capacity = 4096;
  return r;
}

/* Golden vectors. The bytes are docs/route.md's "Canonical encoding and id"
 * layout; the ids were computed outside this code base (`sha256sum` of the
 * bytes). A change here is a new route format: bump MBD_ROUTE_FORMAT_VERSION
 * and docs/route.md with it, never just the expected strings. */
typedef struct golden {
  mbd_route_identity r;
  const char *encoding;
  const char *id;
} golden;

static golden golden_cpu(void) {
  golden g;
  memset(&g, 0, sizeof g);
  g.r.mode = MBD_GEMM_DETERMINISTIC;
  g.r.policy = MBD_POLICY_F32;
  g.r.family = MBD_FAMILY_INFERENCE;
  g.r.backend = MBD_BACKEND_CPU;
  snprintf(g.r.isa, sizeof g.r.isa, "x86-64-v3");
  snprintf(g.r.kernel_digest, sizeof g.r.kernel_digest, "%s",
           "dd56de4137951d9c92681b03416ec15f886b4482a27e3a517d32f085244cbe5d");
  snprintf(g.r.compiler, sizeof g.r.compiler, "12.2.0");
  snprintf(g.r.device_name, sizeof g.r.device_name, "cpu");
  g.r.dispatch_rev = 1;
  g.r.state_capacity = 64;
  g.encoding = "mambad-route/3\n"
               "backend=cpu\n"
               "mode=deterministic\n"
               "dtype=f32\n"
               "state=f32\n"
               "family=inference\n"
               "isa=x86-64-v3\n"
               "kernels=dd56de4137951d9c92681b03416ec15f886b4482a27e3a517d32f085244cbe5d\n"
               "compiler=12.2.0\n"
               "device=cpu\n"
               "cc=0.0\n"
               "sms=0\n"
               "libraries=\n"
               "dispatch=1\n"
               "decode=per-op\n"
               "state_capacity=64\n";
  g.id = "d87a0ecc1ca87b5e61f905a57bdfbbb9314380562349614d2a661c26659f9d96";
  return g;
}

static golden golden_cuda(void) {
  golden g;
  memset(&g, 0, sizeof g);
  g.r.mode = MBD_GEMM_CUBLAS_PEDANTIC;
  g.r.policy = MBD_POLICY_BF16;
  g.r.state = MBD_STATE_BF16;
  g.r.family = MBD_FAMILY_TRIAD;
  g.r.backend = MBD_BACKEND_CUDA;
  snprintf(g.r.isa, sizeof g.r.isa, "sm_90a");
  snprintf(g.r.kernel_digest, sizeof g.r.kernel_digest, "%s",
           "0000000000000000000000000000000000000000000000000000000000000abc");
  snprintf(g.r.compiler, sizeof g.r.compiler, "nvcc 12.8 / gcc 12.2");
  snprintf(g.r.device_name, sizeof g.r.device_name, "NVIDIA H200");
  g.r.cc_major = 9;
  g.r.cc_minor = 0;
  g.r.sm_count = 132;
  snprintf(g.r.libraries, sizeof g.r.libraries, "cublas 12.8.4");
  g.r.dispatch_rev = 3;
  g.r.decode = MBD_DECODE_PERSISTENT;
  g.r.state_capacity = 4096;
  g.encoding = "mambad-route/3\n"
               "backend=cuda\n"
               "mode=cublas-pedantic\n"
               "dtype=bf16\n"
               "state=bf16\n"
               "family=triad\n"
               "isa=sm_90a\n"
               "kernels=0000000000000000000000000000000000000000000000000000000000000abc\n"
               "compiler=nvcc 12.8 / gcc 12.2\n"
               "device=NVIDIA H200\n"
               "cc=9.0\n"
               "sms=132\n"
               "libraries=cublas 12.8.4\n"
               "dispatch=3\n"
               "decode=persistent\n"
               "state_capacity=4096\n";
  g.id = "51ab4c90cde8fe9b4b01a0a6924c003aca23c7625193b342e7db2f3b9dbf02d0";
  return g;
}

static void check_golden(const golden *g) {
  char buf[1024], id[65];
  size_t len = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_route_encode(&g->r, buf, sizeof buf, &len, &err), MBD_OK);
  if (len != strlen(g->encoding) || memcmp(buf, g->encoding, len))
    fail_msg("route encoding drifted:\n--- got (%zu bytes)\n%s--- want (%zu bytes)\n%s", len, buf,
             strlen(g->encoding), g->encoding);
  mbd_route_id_hex(&g->r, id);
  assert_string_equal(id, g->id);
  /* The id is a function of the bytes alone: hashing the golden text gives it. */
  uint8_t d[32];
  mbd_sha256(g->encoding, strlen(g->encoding), d);
  mbd_sha256_hex(d, id);
  assert_string_equal(id, g->id);
  /* And the golden bytes decode to the identity they came from. */
  mbd_route_identity back;
  assert_int_equal(mbd_route_decode(g->encoding, strlen(g->encoding), &back, &err), MBD_OK);
  assert_memory_equal(&back, &g->r, sizeof back);
}

static void test_golden(void **state) {
  (void)state;
  golden c = golden_cpu(), g = golden_cuda();
  check_golden(&c);
  check_golden(&g);
  /* The CUDA golden identity is sample()'s: the tests below vary the pinned one. */
  mbd_route_identity s = sample();
  assert_memory_equal(&s, &g.r, sizeof s);
}

static void test_names_and_parsers(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_gemm_mode m;
  assert_int_equal(mbd_gemm_mode_parse("cublas-fast", &m, &err), MBD_OK);
  assert_int_equal(m, MBD_GEMM_CUBLAS_FAST);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(mbd_gemm_mode_parse(mbd_gemm_mode_name((mbd_gemm_mode)i), &m, &err), MBD_OK);
    assert_int_equal(m, i);
  }
  assert_int_equal(mbd_gemm_mode_parse("fast", &m, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "'fast'"));
  assert_non_null(strstr(err.msg, "deterministic, cublas-fast, cublas-pedantic"));
  assert_int_equal(mbd_gemm_mode_parse(NULL, &m, &err), MBD_E_INVALID);
  assert_int_equal(mbd_gemm_mode_parse("Deterministic", &m, &err), MBD_E_INVALID);
  /* Non-UTF-8 / control bytes are shown escaped, never raw. */
  assert_int_equal(mbd_gemm_mode_parse("det\xff\n", &m, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "det\\xff\\x0a"));
  /* A very long value is cut, the message still lists the valid values. */
  char longv[600];
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = '\0';
  assert_int_equal(mbd_gemm_mode_parse(longv, &m, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "cublas-pedantic"));

  mbd_dtype_policy p;
  assert_int_equal(mbd_dtype_policy_parse("tf32", &p, &err), MBD_OK);
  assert_int_equal(p, MBD_POLICY_TF32);
  assert_int_equal(mbd_dtype_policy_parse("f64", &p, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "f32, tf32, bf16, f16"));
  mbd_family f;
  assert_int_equal(mbd_family_parse("triad", &f, &err), MBD_OK);
  assert_int_equal(f, MBD_FAMILY_TRIAD);
  assert_int_equal(mbd_family_parse("training", &f, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "inference, triad"));
  mbd_backend_kind b;
  assert_int_equal(mbd_backend_parse("cuda", &b, &err), MBD_OK);
  assert_int_equal(b, MBD_BACKEND_CUDA);
  assert_int_equal(mbd_backend_parse("gpu", &b, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "cpu, cuda"));
  mbd_decode_path dp;
  assert_int_equal(mbd_decode_path_parse("per-op", &dp, &err), MBD_OK);
  assert_int_equal(dp, MBD_DECODE_PER_OP);
  assert_int_equal(mbd_decode_path_parse("persistent", &dp, &err), MBD_OK);
  assert_int_equal(dp, MBD_DECODE_PERSISTENT);
  assert_int_equal(mbd_decode_path_parse("fused", &dp, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "per-op, persistent"));
  mbd_state_dtype sd;
  assert_int_equal(mbd_state_dtype_parse("bf16", &sd, &err), MBD_OK);
  assert_int_equal(sd, MBD_STATE_BF16);
  assert_int_equal(mbd_state_dtype_parse("f32", &sd, &err), MBD_OK);
  assert_int_equal(sd, MBD_STATE_F32);
  assert_int_equal(mbd_state_dtype_parse("f16", &sd, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "state dtype 'f16'"));
  assert_non_null(strstr(err.msg, "f32, bf16"));
  assert_string_equal(mbd_state_dtype_name(MBD_STATE_BF16), "bf16");
  assert_string_equal(mbd_state_dtype_name((mbd_state_dtype)2), "?");
  assert_string_equal(mbd_decode_path_name((mbd_decode_path)2), "?");
  assert_string_equal(mbd_gemm_mode_name((mbd_gemm_mode)7), "?");
  assert_string_equal(mbd_backend_name((mbd_backend_kind)-1), "?");
}

static void test_encode_decode(void **state) {
  (void)state;
  mbd_route_identity r = sample(), back;
  char buf[1024];
  size_t len = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_int_equal(strlen(buf), len);
  assert_int_equal(strncmp(buf, "mambad-route/3\nbackend=cuda\nmode=cublas-pedantic\n", 48), 0);
  assert_non_null(strstr(buf, "\ndtype=bf16\nstate=bf16\nfamily=triad\n"));
  assert_non_null(strstr(buf, "\ncc=9.0\nsms=132\n"));
  assert_non_null(strstr(buf, "\ndispatch=3\ndecode=persistent\nstate_capacity=4096\n"));
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_memory_equal(&r, &back, sizeof r);
  r.decode = MBD_DECODE_PER_OP;
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_non_null(strstr(buf, "\ndecode=per-op\n"));
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_memory_equal(&r, &back, sizeof r);
  r.state = MBD_STATE_F32;
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_non_null(strstr(buf, "\nstate=f32\n"));
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_memory_equal(&r, &back, sizeof r);
  /* Maximal string fields still fit in 1 KiB and round-trip. */
  memset(r.isa, 'i', sizeof r.isa - 1);
  memset(r.kernel_digest, 'f', sizeof r.kernel_digest - 1);
  memset(r.compiler, 'c', sizeof r.compiler - 1);
  memset(r.device_name, 'd', sizeof r.device_name - 1);
  memset(r.libraries, 'l', sizeof r.libraries - 1);
  r.state_capacity = INT64_MAX;
  r.sm_count = -1;
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_memory_equal(&r, &back, sizeof r);
  /* Too-small buffers are refused, not overrun. */
  for (size_t cap = 0; cap <= len; cap += 7) {
    char small[1024];
    memset(small, 'Z', sizeof small);
    assert_int_equal(mbd_route_encode(&r, small, cap, NULL, &err), MBD_E_TOO_LARGE);
    assert_int_equal(small[cap], 'Z');
  }
  /* Newlines in text fields cannot forge extra lines. */
  r = sample();
  snprintf(r.device_name, sizeof r.device_name, "evil\nbackend=cpu");
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_int_equal(back.backend, MBD_BACKEND_CUDA);
  assert_string_equal(back.device_name, "evil backend=cpu");
  /* '=' and '\r' in a value: the key is cut at the first '=', '\r' becomes a space. */
  snprintf(r.device_name, sizeof r.device_name, "a=b\rc");
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_non_null(strstr(buf, "\ndevice=a=b c\n"));
  assert_int_equal(mbd_route_decode(buf, len, &back, &err), MBD_OK);
  assert_string_equal(back.device_name, "a=b c");
}

static void test_decode_errors(void **state) {
  (void)state;
  mbd_route_identity r = sample(), back;
  char buf[1024];
  size_t len;
  mbd_error err = {0};
  assert_int_equal(mbd_route_encode(&r, buf, sizeof buf, &len, &err), MBD_OK);
  assert_int_equal(mbd_route_decode(buf, 0, &back, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_route_decode("mambad-route/1\n", 15, &back, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "mambad-route/3"));
  /* The previous format (no state line) is refused by its version line. */
  assert_int_equal(mbd_route_decode("mambad-route/2\nbackend=cpu\n", 27, &back, &err),
                   MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "mambad-route/3"));
  char big[2048];
  memset(big, 'a', sizeof big);
  assert_int_equal(mbd_route_decode(big, sizeof big, &back, &err), MBD_E_FORMAT);
  /* A bad enum value names the valid ones. */
  char bad[1024];
  snprintf(bad, sizeof bad, "%s", buf);
  char *mode = strstr(bad, "mode=cublas-pedantic");
  assert_non_null(mode);
  memcpy(mode, "mode=cublas-pedantix", 20);
  assert_int_equal(mbd_route_decode(bad, len, &back, &err), MBD_E_FORMAT);
  assert_int_equal(err.code, MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "'cublas-pedantix'"));
  assert_non_null(strstr(err.msg, "deterministic, cublas-fast, cublas-pedantic"));
  snprintf(bad, sizeof bad, "%s", buf);
  char *dec = strstr(bad, "decode=persistent");
  assert_non_null(dec);
  memcpy(dec, "decode=persistenz", 17);
  assert_int_equal(mbd_route_decode(bad, len, &back, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "per-op, persistent"));
  snprintf(bad, sizeof bad, "%s", buf);
  char *sdl = strstr(bad, "\nstate=bf16");
  assert_non_null(sdl);
  memcpy(sdl, "\nstate=bf17", 11);
  assert_int_equal(mbd_route_decode(bad, len, &back, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "'bf17'"));
  assert_non_null(strstr(err.msg, "f32, bf16"));
  /* No state line: refused, naming it (state_capacity= does not stand in for it). */
  snprintf(bad, sizeof bad, "%s", buf);
  sdl = strstr(bad, "\nstate=bf16");
  sdl[1] = 'x';
  assert_int_equal(mbd_route_decode(bad, len, &back, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "'state='"));
  /* Every truncation either fails or (cut inside the last value) decodes. */
  for (size_t n = 0; n < len; n++) {
    int rc = mbd_route_decode(buf, n, &back, &err);
    assert_true(rc == MBD_E_FORMAT || (rc == MBD_OK && n > len - 6));
  }
  /* Missing line. */
  snprintf(bad, sizeof bad, "%s", buf);
  char *sms = strstr(bad, "sms=");
  sms[0] = 'x';
  assert_int_equal(mbd_route_decode(bad, len, &back, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_route_decode(NULL, 0, &back, &err), MBD_E_FORMAT);
}

static void test_id(void **state) {
  (void)state;
  mbd_route_identity r = sample(), copy = sample();
  char a[65], b[65];
  mbd_route_id_hex(&r, a);
  mbd_route_id_hex(&copy, b);
  assert_string_equal(a, b);
  assert_int_equal(strlen(a), 64);
  assert_int_equal(strspn(a, "0123456789abcdef"), 64);
  /* The id is SHA-256 of the canonical encoding. */
  char enc[1024];
  size_t len;
  assert_int_equal(mbd_route_encode(&r, enc, sizeof enc, &len, NULL), MBD_OK);
  uint8_t d[32];
  mbd_sha256(enc, len, d);
  mbd_sha256_hex(d, b);
  assert_string_equal(a, b);
  /* Bytes after a string's NUL do not matter. */
  memset(copy.isa + 7, 'Q', sizeof copy.isa - 8);
  mbd_route_id_hex(&copy, b);
  assert_string_equal(a, b);

  /* Changing any single field changes the id; all ids distinct. */
  enum { NV = 17 };
  char ids[NV][65];
  for (int k = 0; k < NV; k++) {
    mbd_route_identity v = sample();
    switch (k) {
      case 0: break;
      case 1: v.mode = MBD_GEMM_DETERMINISTIC; break;
      case 2: v.policy = MBD_POLICY_F32; break;
      case 3: v.family = MBD_FAMILY_INFERENCE; break;
      case 4: v.backend = MBD_BACKEND_CPU; break;
      case 5: v.isa[0] = 'S'; break;
      case 6: v.kernel_digest[63] = '1'; break;
      case 7: v.compiler[0] = 'N'; break;
      case 8: v.device_name[strlen(v.device_name) - 1] = '1'; break;
      case 9: v.cc_major = 8; break;
      case 10: v.cc_minor = 9; break;
      case 11: v.sm_count = 114; break;
      case 12: v.libraries[0] = '\0'; break;
      case 13: v.dispatch_rev = 4; break;
      case 14: v.state_capacity = 4097; break;
      case 15: v.decode = MBD_DECODE_PER_OP; break;
      case 16: v.state = MBD_STATE_F32; break;
    }
    mbd_route_id_hex(&v, ids[k]);
    for (int j = 0; j < k; j++)
      if (!strcmp(ids[j], ids[k])) fail_msg("variants %d and %d share id %s", j, k, ids[k]);
  }
  assert_string_equal(ids[0], a);
}

static void test_matching(void **state) {
  (void)state;
  mbd_route_identity r = sample();
  char id[65];
  mbd_route_id_hex(&r, id);
  mbd_route_want w;
  memset(&w, 0, sizeof w);
  assert_true(mbd_route_matches(&w, &r, id)); /* empty = any */
  char fmt[256];
  mbd_route_want_format(&w, fmt, sizeof fmt);
  assert_string_equal(fmt, "any");

  snprintf(w.route_id, sizeof w.route_id, "%s", id);
  assert_true(mbd_route_matches(&w, &r, id));
  w.route_id[8] = '\0'; /* 8-digit prefix */
  assert_true(mbd_route_matches(&w, &r, id));
  for (int i = 0; i < 8; i++) w.route_id[i] = (char)((w.route_id[i] >= 'a') ? w.route_id[i] - 32 : w.route_id[i]);
  assert_true(mbd_route_matches(&w, &r, id)); /* upper-case hex */
  w.route_id[7] = '\0'; /* too short to be an id */
  assert_false(mbd_route_matches(&w, &r, id));
  snprintf(w.route_id, sizeof w.route_id, "%s", id);
  w.route_id[63] = (char)(w.route_id[63] == '0' ? '1' : '0');
  assert_false(mbd_route_matches(&w, &r, id));
  memset(&w, 0, sizeof w);

  snprintf(w.backend, sizeof w.backend, "cuda");
  snprintf(w.gemm_mode, sizeof w.gemm_mode, "cublas-pedantic");
  snprintf(w.dtype, sizeof w.dtype, "bf16");
  snprintf(w.state, sizeof w.state, "bf16");
  snprintf(w.family, sizeof w.family, "triad");
  snprintf(w.device_name, sizeof w.device_name, "NVIDIA H200");
  assert_true(mbd_route_matches(&w, &r, id));
  mbd_route_want_format(&w, fmt, sizeof fmt);
  assert_string_equal(fmt, "backend=cuda gemm_mode=cublas-pedantic dtype=bf16 state=bf16 "
                           "family=triad device=NVIDIA H200");
  /* Each constraint alone can exclude. */
  for (int k = 0; k < 6; k++) {
    mbd_route_want x = w;
    switch (k) {
      case 0: snprintf(x.backend, sizeof x.backend, "cpu"); break;
      case 1: snprintf(x.gemm_mode, sizeof x.gemm_mode, "deterministic"); break;
      case 2: snprintf(x.dtype, sizeof x.dtype, "f16"); break;
      case 3: snprintf(x.family, sizeof x.family, "inference"); break;
      case 4: snprintf(x.device_name, sizeof x.device_name, "NVIDIA H100"); break;
      case 5: snprintf(x.state, sizeof x.state, "f32"); break;
    }
    assert_false(mbd_route_matches(&x, &r, id));
  }
  /* Formatting into small buffers stays terminated and in bounds. */
  for (size_t cap = 1; cap < 40; cap++) {
    char t[64];
    memset(t, 'Z', sizeof t);
    mbd_route_want_format(&w, t, cap);
    assert_true(strlen(t) < cap);
    assert_int_equal(t[cap], 'Z');
  }
  char z = 'Z';
  mbd_route_want_format(&w, &z, 0);
  assert_int_equal(z, 'Z');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden),            cmocka_unit_test(test_names_and_parsers),
      cmocka_unit_test(test_encode_decode),
      cmocka_unit_test(test_decode_errors),     cmocka_unit_test(test_id),
      cmocka_unit_test(test_matching),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
