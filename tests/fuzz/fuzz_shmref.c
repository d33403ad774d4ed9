/* Fuzz target: the worker's request decoding with its shm and CUDA IPC refs
 * (worker/request.c), the caller stamp, the shm name rule and the owner, type
 * and range checks of worker/shm.c.
 *
 * Input layout: byte 0 = command (mapped onto the worker's request commands),
 * the rest = the msgpack body. Invariants: a failure carries a negative code
 * and a message; a decoded request's refs carry the stamped caller; an accepted
 * shm name follows the documented pattern; a resolved shm input lies inside the
 * object and has the tensor's byte size. Only names starting "/mbd-fuzz-" are
 * opened (the seed object), so fuzzing never maps anyone's real objects. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/protocol.h"
#include "mbd_fuzz.h"
#include "worker/request.h"
#include "worker/shm.h"

#define OBJ_BYTES 4096

static mbd_shm_cache *g_cache;
static char g_obj[64];

static void drop_obj(void) { shm_unlink(g_obj); }

static void init_once(void) {
  if (g_cache) return;
  mbd_error err = {0};
  MBD_FUZZ_CHECK(mbd_shm_cache_new(4, &g_cache, &err) == 0);
  snprintf(g_obj, sizeof g_obj, "/mbd-fuzz-%d", (int)getpid());
  shm_unlink(g_obj);
  atexit(drop_obj);
  int fd = shm_open(g_obj, O_CREAT | O_RDWR, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, OBJ_BYTES)) {
    }
    close(fd);
  }
}

static void check_name(const char *n) {
  mbd_error err = {0};
  if (mbd_shm_name_check(n, &err)) {
    MBD_FUZZ_CHECK(err.code < 0 && err.msg[0]);
    return;
  }
  size_t len = strlen(n);
  MBD_FUZZ_CHECK(len >= 2 && len < MBD_SHM_NAME_MAX && n[0] == '/' && n[1] != '.');
  MBD_FUZZ_CHECK(!strchr(n + 1, '/'));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  init_once();
  static const uint8_t cmds[] = {MBD_CMD_GEMM, MBD_CMD_FORWARD, MBD_CMD_PREFILL, MBD_CMD_STEP,
                                 MBD_CMD_IMPORT};
  uint8_t cmd = cmds[data[0] % sizeof cmds];
  mbd_body *b = NULL;
  mbd_error err = {0};
  if (mbd_body_parse(data + 1, size - 1, &b, &err)) {
    MBD_FUZZ_CHECK(err.code < 0 && err.msg[0]);
    return 0;
  }
  mbd_wreq *q = calloc(1, sizeof *q);
  MBD_FUZZ_CHECK(q != NULL);
  int rc = mbd_wreq_decode(cmd, mbd_body_root(b), q, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.msg[0]);
    goto done;
  }
  mbd_tensor_ref *all[2] = {q->tensors, q->outputs};
  size_t n[2] = {q->ntensors, q->noutputs};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < n[k]; i++) {
      mbd_tensor_ref *r = &all[k][i];
      MBD_FUZZ_CHECK(r->caller_known == q->caller.has_uid);
      MBD_FUZZ_CHECK(!r->caller_known || r->caller_uid == q->caller.uid);
      if (r->kind != MBD_TREF_SHM) continue;
      check_name(r->shm_name);
      if (strncmp(r->shm_name, "/mbd-fuzz-", 10)) continue;
      const void *p = NULL;
      size_t nb = 0;
      mbd_error e = {0};
      if (k == 0) {
        rc = mbd_wreq_input(r, NULL, g_cache, &p, &nb, &e);
        if (rc == 0) {
          MBD_FUZZ_CHECK(p != NULL && r->offset + nb <= OBJ_BYTES && nb <= r->size);
          MBD_FUZZ_CHECK(r->caller_known && r->caller_uid == (uint32_t)geteuid());
        }
      } else {
        void *w = NULL;
        rc = mbd_wreq_output(r, &r->desc, g_cache, &w, &e);
        if (rc == 0) MBD_FUZZ_CHECK(w != NULL && r->caller_known);
      }
      if (rc) MBD_FUZZ_CHECK(rc < 0 && e.msg[0]);
    }
done:
  free(q);
  mbd_body_destroy(&b);
  return 0;
}

/* GEMM bodies whose first tensor is the seed object, with and without the caller stamp. */
static uint8_t g_seed[3][512];
static size_t build(uint8_t *dst, int variant) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, variant ? 3 : 2);
  mbd_pack_kv_str(&pk, "dtype", "f32");
  mbd_tensor_ref a;
  memset(&a, 0, sizeof a);
  strcpy(a.name, "a");
  int64_t s[2] = {4, 8};
  mbd_tensor_desc_make(&a.desc, MBD_DTYPE_F32, 2, s, NULL);
  a.kind = MBD_TREF_SHM;
  snprintf(a.shm_name, sizeof a.shm_name, variant == 2 ? "/.." : "/mbd-fuzz-%d", (int)getpid());
  a.offset = 64;
  a.size = 128;
  mbd_tensor_ref bb = a;
  strcpy(bb.name, "b");
  bb.kind = MBD_TREF_INLINE;
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 2);
  mbd_pack_tensor_ref(&pk, &a);
  mbd_pack_tensor_ref(&pk, &bb);
  if (variant) {
    mbd_pack_str(&pk, "caller");
    msgpack_pack_map(&pk, 4);
    mbd_pack_kv_str(&pk, "id", "uid:0");
    mbd_pack_kv_u64(&pk, "uid", (uint64_t)geteuid());
    mbd_pack_kv_u64(&pk, "gid", 0);
    mbd_pack_kv_i64(&pk, "pid", 1);
  }
  size_t n = sb.size + 1 <= 512 ? sb.size : 511;
  dst[0] = 0;
  memcpy(dst + 1, sb.data, n);
  msgpack_sbuffer_destroy(&sb);
  return n + 1;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static mbd_fuzz_seed seeds[3];
  for (int i = 0; i < 3; i++) {
    seeds[i].len = build(g_seed[i], i);
    seeds[i].data = g_seed[i];
  }
  *out = seeds;
  return 3;
}
