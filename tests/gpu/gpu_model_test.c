/* The GPU model tests' fixtures, backends and shared checks (see
 * gpu_model_test.h). */
#include "tests/gpu/gpu_model_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "support/backend_calls.h"
#include "support/model_check.h"

static void *copy_entry(const mbd_safetensors *st, const char *name) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  if (!e) return NULL;
  void *v = malloc(e->nbytes);
  assert_non_null(v);
  memcpy(v, e->data, e->nbytes);
  return v;
}

int gmt_fixture_load(const char *family, const char *name, gmt_fixture *f) {
  memset(f, 0, sizeof *f);
  const char *root = getenv("MBD_FIXTURES_DIR");
  if (!root) return -1;
  snprintf(f->dir, sizeof f->dir, "%s/%s/%s", root, family, name);
  char p[1200];
  snprintf(p, sizeof p, "%s/expected.safetensors", f->dir);
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  if (mbd_safetensors_open(p, &st, &err)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(st, "logits");
  const mbd_st_entry *gr = mbd_safetensors_find(st, "greedy");
  assert_non_null(ids);
  assert_non_null(lg);
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->V = lg->desc.shape[2];
  f->G = gr ? gr->desc.shape[1] - f->T : 0;
  f->ids = copy_entry(st, "input_ids");
  f->greedy = copy_entry(st, "greedy");
  f->hf = copy_entry(st, "logits");
  f->lbf16 = copy_entry(st, "logits_bf16");
  f->glogits = copy_entry(st, "greedy_logits");
  f->target = copy_entry(st, "logits_norm_per_group");
  f->target_is_hf = f->target == NULL;
  if (!f->target) f->target = copy_entry(st, "logits");
  mbd_safetensors_destroy(&st);
  return 0;
}

void gmt_fixture_free(gmt_fixture *f) {
  free(f->ids);
  free(f->greedy);
  free(f->hf);
  free(f->lbf16);
  free(f->glogits);
  free(f->target);
  memset(f, 0, sizeof *f);
}

mbd_backend *gmt_backend(mbd_backend_kind kind, mbd_dtype_policy policy, mbd_state_dtype sd) {
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = policy, .state = sd,
                        .threads = 2, .state_capacity = 300, .max_batch = 256};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  if (mbd_backend_new(kind, &o, &b, &err)) fail_msg("backend: %s", err.msg);
  return b;
}

void gmt_remove_checkpoints(char (*dirs)[64], int n) {
  for (int k = 0; k < n; k++) {
    if (!dirs[k][0]) continue;
    char p[160];
    snprintf(p, sizeof p, "%.63s/config.json", dirs[k]);
    unlink(p);
    snprintf(p, sizeof p, "%.63s/model.safetensors", dirs[k]);
    unlink(p);
    rmdir(dirs[k]);
  }
}

void gmt_check_bf16_image(const uint8_t *img, size_t n, int64_t ssm_floats) {
  assert_true(n >= (size_t)ssm_floats * 4);
  const uint8_t *ssm = img + n - (size_t)ssm_floats * 4;
  int nonzero = 0;
  for (int64_t i = 0; i < ssm_floats; i++) {
    uint32_t u;
    memcpy(&u, ssm + 4 * i, 4);
    if (u & 0xffffu)
      fail_msg("state image entry %lld is not a bf16 value (0x%08x)", (long long)i, u);
    nonzero |= u != 0;
  }
  assert_true(nonzero);
}

void gmt_check_route_bf16(void) {
  mbd_backend *b = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_F32, MBD_STATE_BF16);
  mbd_route_identity r;
  b->ops->route(b, &r);
  assert_int_equal(r.state, MBD_STATE_BF16);
  char enc[1024];
  size_t len = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_route_encode(&r, enc, sizeof enc, &len, &err), 0);
  assert_non_null(strstr(enc, "\nstate=bf16\n"));
  mbd_backend *f = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_F32, MBD_STATE_F32);
  mbd_route_identity rf;
  f->ops->route(f, &rf);
  assert_int_equal(rf.state, MBD_STATE_F32);
  char a[65], c[65];
  mbd_route_id_hex(&r, a);
  mbd_route_id_hex(&rf, c);
  assert_string_not_equal(a, c);
  mbd_backend_destroy(&b);
  mbd_backend_destroy(&f);
}

void gmt_check_chunked_prefill(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int64_t T,
                               int64_t V, const int64_t *chunks, size_t nchunks,
                               int64_t pre_step, const float *gd, const uint8_t *gi, size_t gn,
                               const char *what) {
  float *got = malloc((size_t)(T * V) * 4);
  assert_non_null(got);
  mbd_error err = {0};
  for (size_t k = 0; k < nchunks; k++) {
    for (int64_t pre = 1; pre <= T; pre += pre_step) {
      mbd_bstate *s = bc_new_state(gb, gm);
      for (int64_t t0 = 0; t0 < pre; t0 += chunks[k]) {
        int64_t len = pre - t0 < chunks[k] ? pre - t0 : chunks[k];
        assert_int_equal(gb->ops->prefill(gb, gm, s, ids + t0, len, false, got + t0 * V, &err),
                         0);
      }
      for (int64_t t = pre; t < T; t++)
        assert_int_equal(gb->ops->step(gb, gm, &s, ids + t, 1, got + t * V, &err), 0);
      if (memcmp(got, gd, (size_t)(T * V) * 4))
        fail_msg("%s: prefill of %lld in chunks of %lld then decode != decode", what,
                 (long long)pre, (long long)chunks[k]);
      size_t sn = 0;
      uint8_t *si = bc_save(gb, s, &sn);
      assert_int_equal(sn, gn);
      assert_memory_equal(si, gi, gn);
      free(si);
      gb->ops->state_free(gb, s);
    }
  }
  free(got);
}

void gmt_check_batched_decode(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int ns,
                              int64_t tl, int64_t V, const float *fw, const char *what) {
  mbd_bstate **st = malloc((size_t)ns * sizeof *st);
  int64_t *tk = malloc((size_t)ns * 8);
  float *row = malloc((size_t)ns * V * 4);
  assert_non_null(st);
  assert_non_null(tk);
  assert_non_null(row);
  mbd_error err = {0};
  for (int i = 0; i < ns; i++) st[i] = bc_new_state(gb, gm);
  for (int64_t t = 0; t < tl; t++) {
    for (int i = 0; i < ns; i++) tk[i] = ids[i * tl + t];
    assert_int_equal(gb->ops->step(gb, gm, st, tk, ns, row, &err), 0);
    for (int i = 0; i < ns; i++)
      if (memcmp(row + (size_t)i * V, fw + ((size_t)i * tl + t) * V, (size_t)V * 4))
        fail_msg("%s: sequence %d step %lld: batched decode != forward of %d x %lld", what, i,
                 (long long)t, ns, (long long)tl);
  }
  for (int i = 0; i < ns; i++) gb->ops->state_free(gb, st[i]);
  free(row);
  free(tk);
  free(st);
}

void gmt_check_long_prefill(mbd_backend *gb, mbd_bmodel *gm, const int64_t *ids, int64_t tl,
                            int64_t V, int64_t piece, int64_t bf16_ssm) {
  float *a = malloc((size_t)tl * V * 4), *b = malloc((size_t)tl * V * 4);
  assert_non_null(a);
  assert_non_null(b);
  uint8_t *ia = NULL;
  size_t na = 0;
  mbd_error err = {0};
  bc_decode_all(gb, gm, ids, tl, V, a, &ia, &na);
  if (bf16_ssm > 0) gmt_check_bf16_image(ia, na, bf16_ssm);
  mbd_bstate *s = bc_new_state(gb, gm);
  assert_int_equal(gb->ops->prefill(gb, gm, s, ids, tl, false, b, &err), 0);
  assert_memory_equal(a, b, (size_t)tl * V * 4);
  size_t nb = 0;
  uint8_t *ib = bc_save(gb, s, &nb);
  assert_memory_equal(ia, ib, na);
  free(ib);
  gb->ops->state_free(gb, s);
  if (piece > 0) {
    s = bc_new_state(gb, gm);
    for (int64_t t0 = 0; t0 < tl; t0 += piece) {
      const int64_t len = tl - t0 < piece ? tl - t0 : piece;
      assert_int_equal(gb->ops->prefill(gb, gm, s, ids + t0, len, false, b + t0 * V, &err), 0);
    }
    assert_memory_equal(a, b, (size_t)tl * V * 4);
    ib = bc_save(gb, s, &nb);
    assert_memory_equal(ia, ib, na);
    free(ib);
    gb->ops->state_free(gb, s);
  }
  free(ia);
  free(a);
  free(b);
}

int64_t *gmt_batch_tokens(int64_t V, int steps) {
  int64_t *tok = malloc((size_t)GMT_NMAX * steps * 8);
  assert_non_null(tok);
  for (int i = 0; i < GMT_NMAX; i++)
    for (int t = 0; t < steps; t++) tok[i * steps + t] = (i * 131 + t * 17 + 5) % V;
  return tok;
}

float *gmt_solo_runs(mbd_backend *gb, mbd_bmodel *gm, int64_t V, const int64_t *tok, int steps) {
  float *solo = malloc((size_t)GMT_NMAX * steps * V * 4);
  assert_non_null(solo);
  for (int i = 0; i < GMT_NMAX; i++) {
    uint8_t *img = NULL;
    size_t in = 0;
    bc_decode_all(gb, gm, tok + (size_t)i * steps, steps, V, solo + (size_t)i * steps * V, &img,
                  &in);
    free(img);
  }
  return solo;
}

void gmt_check_batched_eq_solo(mbd_backend *gb, mbd_bmodel *gm, int64_t V, const int64_t *tok,
                               int steps, const float *solo, const char *what) {
  static const int sizes[] = {2, 3, 7, 16, 33, 64, 129, 256};
  float *rows = malloc((size_t)GMT_NMAX * V * 4);
  assert_non_null(rows);
  mbd_error err = {0};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const int n = sizes[k];
    mbd_bstate *st[GMT_NMAX];
    int64_t tk[GMT_NMAX];
    for (int i = 0; i < n; i++) st[i] = bc_new_state(gb, gm);
    for (int t = 0; t < steps; t++) {
      for (int i = 0; i < n; i++) tk[i] = tok[(size_t)((i * 7 + (int)k) % GMT_NMAX) * steps + t];
      assert_int_equal(gb->ops->step(gb, gm, st, tk, n, rows, &err), 0);
      for (int i = 0; i < n; i++)
        if (memcmp(rows + (size_t)i * V,
                   solo + ((size_t)((i * 7 + (int)k) % GMT_NMAX) * steps + t) * V,
                   (size_t)V * 4))
          fail_msg("%s: row %d of a batch of %d, step %d != its solo run", what, i, n, t);
    }
    for (int i = 0; i < n; i++) gb->ops->state_free(gb, st[i]);
  }
  free(rows);
}

void gmt_check_batch_invariance(mbd_backend *gb, mbd_bmodel *gm, int steps, const char *what) {
  const int64_t V = gb->ops->model_vocab(gm);
  int64_t *tok = gmt_batch_tokens(V, steps);
  float *solo = gmt_solo_runs(gb, gm, V, tok, steps);
  gmt_check_batched_eq_solo(gb, gm, V, tok, steps, solo, what);
  free(solo);
  free(tok);
}

void gmt_check_export_import(const char *dir, int64_t ssm_floats) {
  mbd_backend *gb = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_BF16, MBD_STATE_BF16);
  mbd_backend *gb2 = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_BF16, MBD_STATE_BF16);
  mbd_bmodel *gm = bc_load(gb, dir), *gm2 = bc_load(gb2, dir);
  const int64_t T = 37, V = gb->ops->model_vocab(gm), H = T / 2;
  int64_t ids[37];
  for (int64_t i = 0; i < T; i++) ids[i] = (i * 211 + 5) % V;
  mbd_error err = {0};
  float *ref = malloc((size_t)(T * V) * 4), *got = malloc((size_t)(T * V) * 4);
  assert_non_null(ref);
  assert_non_null(got);
  uint8_t *ri = NULL;
  size_t rn = 0;
  bc_decode_all(gb, gm, ids, T, V, ref, &ri, &rn);
  mbd_bstate *s = bc_new_state(gb, gm);
  assert_int_equal(gb->ops->prefill(gb, gm, s, ids, H, false, got, &err), 0);
  size_t in = 0;
  uint8_t *img = bc_save(gb, s, &in);
  gmt_check_bf16_image(img, in, ssm_floats);
  mbd_backend *bs[2] = {gb, gb2};
  mbd_bmodel *ms[2] = {gm, gm2};
  for (int k = 0; k < 2; k++) {
    mbd_bstate *t = bc_new_state(bs[k], ms[k]);
    assert_int_equal(bs[k]->ops->state_load(t, img, in, &err), 0);
    size_t bn = 0;
    uint8_t *back = bc_save(bs[k], t, &bn);
    assert_memory_equal(back, img, in); /* import then export: the same image */
    free(back);
    assert_int_equal(bs[k]->ops->prefill(bs[k], ms[k], t, ids + H, T - H, false, got, &err), 0);
    assert_memory_equal(got, ref + H * V, (size_t)((T - H) * V) * 4);
    back = bc_save(bs[k], t, &bn);
    assert_memory_equal(back, ri, rn);
    free(back);
    bs[k]->ops->state_free(bs[k], t);
  }
  /* the device stash: save, export == state_save, load into another state, continue */
  if (gb->ops->stash_bytes) {
    mbd_backend *fb = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_BF16, MBD_STATE_F32);
    mbd_bmodel *fm = bc_load(fb, dir);
    const size_t sb = gb->ops->stash_bytes(gb, gm), fsb = fb->ops->stash_bytes(fb, fm);
    assert_int_equal(fsb - sb, (size_t)ssm_floats * 2); /* 2 bytes an SSM entry, not 4 */
    fb->ops->model_destroy(fb, fm);
    mbd_backend_destroy(&fb);
    mbd_bstash *st = NULL;
    assert_int_equal(gb->ops->stash_new(gb, gm, &st, &err), 0);
    assert_int_equal(gb->ops->stash_save(gb, st, s, &err), 0);
    uint8_t *ex = malloc(in);
    assert_non_null(ex);
    assert_int_equal(gb->ops->stash_export(gb, st, ex, in, &err), 0);
    assert_memory_equal(ex, img, in);
    mbd_bstate *t = bc_new_state(gb, gm);
    assert_int_equal(gb->ops->stash_load(gb, t, st, &err), 0);
    assert_int_equal(gb->ops->prefill(gb, gm, t, ids + H, T - H, false, got, &err), 0);
    assert_memory_equal(got, ref + H * V, (size_t)((T - H) * V) * 4);
    gb->ops->state_free(gb, t);
    gb->ops->stash_free(gb, st);
    free(ex);
  }
  /* an image of the f32-state route imports (rounded) and runs */
  {
    mbd_backend *fb = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_BF16, MBD_STATE_F32);
    mbd_bmodel *fm = bc_load(fb, dir);
    mbd_bstate *fs = bc_new_state(fb, fm), *t = bc_new_state(gb, gm);
    assert_int_equal(fb->ops->prefill(fb, fm, fs, ids, H, true, got, &err), 0);
    size_t fn = 0;
    uint8_t *fi = bc_save(fb, fs, &fn);
    assert_int_equal(fn, in); /* the image is f32 on both routes */
    assert_int_equal(gb->ops->state_load(t, fi, fn, &err), 0);
    size_t bn = 0;
    uint8_t *back = bc_save(gb, t, &bn);
    gmt_check_bf16_image(back, bn, ssm_floats);
    assert_int_equal(gb->ops->step(gb, gm, &t, ids + H, 1, got, &err), 0);
    free(back);
    free(fi);
    gb->ops->state_free(gb, t);
    fb->ops->state_free(fb, fs);
    fb->ops->model_destroy(fb, fm);
    mbd_backend_destroy(&fb);
  }
  print_message("state bf16: export -> import -> continue == decode; stash likewise\n");
  gb->ops->state_free(gb, s);
  free(img);
  free(ri);
  free(ref);
  free(got);
  gb->ops->model_destroy(gb, gm);
  gb2->ops->model_destroy(gb2, gm2);
  mbd_backend_destroy(&gb);
  mbd_backend_destroy(&gb2);
}

void gmt_check_bf16_refusals(const char *m3_dir) {
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state = MBD_STATE_BF16, .threads = 1, .state_capacity = 4,
                        .max_batch = 4};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CPU, &o, &b, &err), MBD_E_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "Mamba-1 and Mamba-2 on CUDA only"));
  mbd_backend *gb = gmt_backend(MBD_BACKEND_CUDA, MBD_POLICY_F32, MBD_STATE_BF16);
  mbd_bmodel *m = NULL;
  memset(&err, 0, sizeof err);
  assert_int_not_equal(gb->ops->model_load(gb, m3_dir, &m, &err), 0);
  if (!strstr(err.msg, "Mamba-1 and Mamba-2 on CUDA only")) fail_msg("mamba3: '%s'", err.msg);
  mbd_backend_destroy(&gb);
}

double gmt_check_logits_bound(mbd_backend *gb, mbd_bmodel *gm, const gmt_fixture *f,
                              const float *want, double factor, const char *what) {
  assert_non_null(f->lbf16);
  const size_t n = (size_t)(f->B * f->T * f->V);
  float *g = malloc(n * 4);
  assert_non_null(g);
  mbd_error err = {0};
  assert_int_equal(gb->ops->forward(gb, gm, f->ids, f->B, f->T, false, g, &err), 0);
  const double theirs = mc_max_err(f->lbf16, f->hf, n), bound = factor * theirs;
  const double ours = mc_max_err(g, want, n);
  print_message("%s: max abs err %.4g (bound %.4g = %.2f x PyTorch bf16 %.4g)\n", what, ours,
                bound, factor, theirs);
  if (ours > bound) fail_msg("%s: err %.4g > bound %.4g", what, ours, bound);
  free(g);
  return bound;
}

void gmt_check_forward_decode_prefill(mbd_backend *gb, mbd_bmodel *gm, int64_t B, int64_t T,
                                      int seed, int64_t ssm_floats, const int64_t *chunks,
                                      size_t nchunks, int64_t pre_step, const char *what) {
  const int64_t V = gb->ops->model_vocab(gm);
  int64_t *ids = malloc((size_t)(B * T) * sizeof *ids);
  assert_non_null(ids);
  for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 131 + 7 * seed + 1) % V;
  const size_t n = (size_t)(B * T * V);
  float *g = malloc(n * 4), *g2 = malloc(n * 4);
  mbd_error err = {0};
  assert_int_equal(gb->ops->forward(gb, gm, ids, B, T, false, g, &err), 0);
  assert_int_equal(gb->ops->forward(gb, gm, ids, B, T, false, g2, &err), 0);
  assert_memory_equal(g, g2, n * 4); /* run to run */
  float *gd = malloc((size_t)(T * V) * 4);
  uint8_t *gi = NULL;
  size_t gn = 0;
  bc_decode_all(gb, gm, ids, T, V, gd, &gi, &gn);
  assert_memory_equal(gd, g, (size_t)(T * V) * 4); /* decode == forward */
  gmt_check_bf16_image(gi, gn, ssm_floats);
  gmt_check_chunked_prefill(gb, gm, ids, T, V, chunks, nchunks, pre_step, gd, gi, gn, what);
  free(gd);
  free(gi);
  free(g);
  free(g2);
  free(ids);
}
