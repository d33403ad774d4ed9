/* Shared-memory tensor mappings: name and range validation, LRU mmap cache. */
#include "worker/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/protocol.h"

typedef struct shm_entry {
  char name[MBD_SHM_NAME_MAX]; /* "" = free slot */
  bool writable;               /* mapped PROT_WRITE */
  dev_t dev;                   /* identity of the object the mapping belongs to */
  ino_t ino;
  size_t size; /* mapped length = object size at map time */
  void *base;  /* mmap result */
  uint64_t last_use; /* LRU clock */
} shm_entry;

struct mbd_shm_cache {
  shm_entry *e;   /* max entries */
  size_t max;     /* capacity */
  uint64_t clock; /* bumped on every hit */
  uint64_t maps;  /* mmap calls made */
};

int mbd_shm_cache_new(size_t max_entries, mbd_shm_cache **out, mbd_error *err) {
  *out = NULL;
  if (max_entries == 0) return mbd_error_set(err, MBD_E_INVALID, "shm cache needs >= 1 entry");
  mbd_shm_cache *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the shm cache");
  c->e = calloc(max_entries, sizeof *c->e);
  if (!c->e) {
    free(c);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the shm cache");
  }
  c->max = max_entries;
  *out = c;
  return MBD_OK;
}

static void entry_drop(shm_entry *e) {
  if (e->base) munmap(e->base, e->size);
  memset(e, 0, sizeof *e);
}

void mbd_shm_cache_destroy(mbd_shm_cache **pc) {
  if (!pc || !*pc) return;
  mbd_shm_cache *c = *pc;
  for (size_t i = 0; i < c->max; i++) entry_drop(&c->e[i]);
  free(c->e);
  free(c);
  *pc = NULL;
}

int mbd_shm_name_check(const char *name, mbd_error *err) {
  if (!name || name[0] != '/')
    return mbd_error_set(err, MBD_E_INVALID, "shm name must start with '/' (e.g. \"/mbd-x\")");
  size_t n = strnlen(name, MBD_SHM_NAME_MAX);
  if (n >= MBD_SHM_NAME_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "shm name longer than %d characters",
                         MBD_SHM_NAME_MAX - 1);
  if (n < 2) return mbd_error_set(err, MBD_E_INVALID, "shm name \"/\" is empty");
  for (size_t i = 1; i < n; i++) {
    unsigned char ch = (unsigned char)name[i];
    if (ch == '/')
      return mbd_error_set(err, MBD_E_INVALID, "shm name may contain '/' only at the start");
    if (ch < 0x21 || ch > 0x7e)
      return mbd_error_set(err, MBD_E_INVALID,
                           "shm name has a non-printable or space character at byte %zu", i);
  }
  return MBD_OK;
}

/* Bounds rule, overflow-safe: offset + size <= objsize and size >= need. */
static int check_range(const char *name, uint64_t offset, uint64_t size, size_t need,
                       uint64_t objsize, mbd_error *err) {
  if (size < (uint64_t)need)
    return mbd_error_set(err, MBD_E_INVALID,
                         "shm %s: range size %llu is smaller than the tensor (%zu bytes)", name,
                         (unsigned long long)size, need);
  if (offset > objsize || size > objsize - offset)
    return mbd_error_set(err, MBD_E_INVALID,
                         "shm %s: range [offset %llu, size %llu] runs past the object's end "
                         "(%llu bytes)",
                         name, (unsigned long long)offset, (unsigned long long)size,
                         (unsigned long long)objsize);
  return MBD_OK;
}

int mbd_shm_cache_map(mbd_shm_cache *c, const char *name, uint64_t offset, uint64_t size,
                      size_t need, bool writable, void **out, mbd_error *err) {
  *out = NULL;
  int rc = mbd_shm_name_check(name, err);
  if (rc) return rc;
  int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return mbd_error_set(err, MBD_E_NOT_FOUND, "shm %s does not exist (create it with shm_open "
                           "before sending the request)", name);
    return mbd_error_set(err, e == EACCES ? MBD_E_INVALID : MBD_E_IO, "shm %s: cannot open %s: %s",
                         name, writable ? "read-write" : "read-only", strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mbd_error_set(err, MBD_E_IO, "shm %s: fstat failed: %s", name, strerror(e));
  }
  uint64_t objsize = st.st_size > 0 ? (uint64_t)st.st_size : 0;
  rc = check_range(name, offset, size, need, objsize, err);
  if (rc) {
    close(fd);
    return rc;
  }
  if (objsize == 0 || objsize > SIZE_MAX) { /* only need == size == 0 gets here with 0 */
    close(fd);
    if (objsize == 0) {
      static char empty;
      *out = &empty; /* zero-byte tensor: nothing will be touched */
      return MBD_OK;
    }
    return mbd_error_set(err, MBD_E_TOO_LARGE, "shm %s: object too large to map", name);
  }

  /* Hit: same name, same access, same object (inode) and same size. */
  shm_entry *victim = NULL;
  for (size_t i = 0; i < c->max; i++) {
    shm_entry *e = &c->e[i];
    if (!e->base) {
      if (!victim || victim->base) victim = e;
      continue;
    }
    if (e->writable == writable && !strcmp(e->name, name)) {
      if (e->dev == st.st_dev && e->ino == st.st_ino && e->size == (size_t)objsize) {
        close(fd);
        e->last_use = ++c->clock;
        *out = (char *)e->base + offset;
        return MBD_OK;
      }
      entry_drop(e); /* stale: re-created or resized object */
      victim = e;
      continue;
    }
    if (!victim || (victim->base && e->last_use < victim->last_use)) victim = e;
  }
  void *base = mmap(NULL, (size_t)objsize, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED)
    return mbd_error_set(err, MBD_E_IO, "shm %s: mmap of %llu bytes failed: %s", name,
                         (unsigned long long)objsize, strerror(e));
  c->maps++;
  entry_drop(victim);
  memcpy(victim->name, name, strlen(name) + 1);
  victim->writable = writable;
  victim->dev = st.st_dev;
  victim->ino = st.st_ino;
  victim->size = (size_t)objsize;
  victim->base = base;
  victim->last_use = ++c->clock;
  *out = (char *)base + offset;
  return MBD_OK;
}

size_t mbd_shm_cache_count(const mbd_shm_cache *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->max; i++) n += c->e[i].base != NULL;
  return n;
}

uint64_t mbd_shm_cache_maps(const mbd_shm_cache *c) { return c->maps; }
