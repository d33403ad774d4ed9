/* Shared-memory tensor mappings: name, type, owner and range validation, LRU
 * mmap cache, and the SIGBUS trap for objects truncated under a mapping. */
#include "worker/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
  size_t size;                 /* mapped length = object size at map time */
  void *base;                  /* mmap result */
  uint64_t last_use;           /* LRU clock */
  volatile sig_atomic_t poisoned; /* the SIGBUS handler replaced it with zero pages */
} shm_entry;

struct mbd_shm_cache {
  shm_entry *e;   /* max entries */
  size_t max;     /* capacity */
  uint64_t clock; /* bumped on every hit */
  uint64_t maps;  /* mmap calls made */
  dev_t shm_dev;  /* device of /dev/shm (0 = unknown: not checked) */
  volatile sig_atomic_t faulted;  /* a mapping faulted since the last watch/check */
  volatile sig_atomic_t fault_ix; /* entry index of the last fault */
  char fault_name[MBD_SHM_NAME_MAX]; /* its object name (copied by the handler) */
  uint64_t faults;                /* faults trapped so far */
};

/* The SIGBUS handler must find the mappings from a signal context, so the live
 * caches are listed here (a worker has one; tests a few). */
#define MAX_CACHES 16
static mbd_shm_cache *volatile g_caches[MAX_CACHES];
static size_t g_page = 4096; /* sysconf is not async-signal-safe: read once at registration */
static struct sigaction g_prev_bus;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  char *addr = si ? (char *)si->si_addr : NULL;
  size_t page = g_page;
  for (int k = 0; addr && k < MAX_CACHES; k++) {
    mbd_shm_cache *c = g_caches[k];
    if (!c) continue;
    for (size_t i = 0; i < c->max; i++) {
      shm_entry *e = &c->e[i];
      char *b = e->base;
      if (!b || addr < b || addr >= b + e->size) continue;
      size_t len = (e->size + page - 1) / page * page;
      if (mmap(b, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
          MAP_FAILED)
        break; /* cannot repair: fall through to the previous handler */
      e->poisoned = 1;
      size_t n = 0;
      for (; n + 1 < sizeof c->fault_name && e->name[n]; n++) c->fault_name[n] = e->name[n];
      c->fault_name[n] = '\0';
      c->fault_ix = (sig_atomic_t)i;
      c->faulted = 1;
      c->faults++;
      return;
    }
  }
  if (g_prev_bus.sa_flags & SA_SIGINFO) {
    if (g_prev_bus.sa_sigaction) g_prev_bus.sa_sigaction(sig, si, uc);
    return;
  }
  if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
    g_prev_bus.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL); /* returning re-runs the access, which now kills the process */
}

static int cache_register(mbd_shm_cache *c, mbd_error *err) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  long ps = sysconf(_SC_PAGESIZE);
  if (ps > 0) g_page = (size_t)ps;
  int slot = -1;
  for (int k = 0; k < MAX_CACHES && slot < 0; k++)
    if (!g_caches[k]) slot = k;
  if (slot >= 0) {
    g_caches[slot] = c;
    struct sigaction cur;
    bool ours = sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
                cur.sa_sigaction == on_sigbus;
    if (!ours) { /* first cache, or someone installed a handler since: chain to it */
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_sigaction = on_sigbus;
      sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGBUS, &sa, &g_prev_bus);
    }
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (slot < 0)
    return mbd_error_set(err, MBD_E_INTERNAL, "more than %d shm caches in one process", MAX_CACHES);
  return MBD_OK;
}

static void cache_unregister(mbd_shm_cache *c) {
  for (int k = 0; k < MAX_CACHES; k++)
    if (g_caches[k] == c) g_caches[k] = NULL;
}

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
  struct stat st;
  if (stat("/dev/shm", &st) == 0) c->shm_dev = st.st_dev;
  int rc = cache_register(c, err);
  if (rc) {
    free(c->e);
    free(c);
    return rc;
  }
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
  cache_unregister(c);
  for (size_t i = 0; i < c->max; i++) entry_drop(&c->e[i]);
  free(c->e);
  free(c);
  *pc = NULL;
}

static bool name_char(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_' || ch == '.' || ch == '-';
}

int mbd_shm_name_check(const char *name, mbd_error *err) {
  if (!name || name[0] != '/')
    return mbd_error_set(err, MBD_E_INVALID, "shm name must start with '/' (e.g. \"/mbd-x\")");
  size_t n = strnlen(name, MBD_SHM_NAME_MAX);
  if (n >= MBD_SHM_NAME_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "shm name longer than %d characters",
                         MBD_SHM_NAME_MAX - 1);
  if (n < 2) return mbd_error_set(err, MBD_E_INVALID, "shm name \"/\" is empty");
  if (name[1] == '.')
    return mbd_error_set(err, MBD_E_INVALID,
                         "shm name %.*s starts with '.' after the '/' (\"/.\" and \"/..\" are "
                         "directories, not objects)", (int)n, name);
  for (size_t i = 1; i < n; i++) {
    unsigned char ch = (unsigned char)name[i];
    if (ch == '/')
      return mbd_error_set(err, MBD_E_INVALID, "shm name may contain '/' only at the start");
    if (!name_char(ch))
      return mbd_error_set(err, MBD_E_INVALID,
                           "shm name has character 0x%02x at byte %zu; allowed: letters, digits, "
                           "'_', '.', '-'", ch, i);
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

/* The object behind fd: a regular file on /dev/shm's file system, owned by
 * owner_uid, whose owner may read it (and write it when writable). */
static int check_object(const mbd_shm_cache *c, const char *name, const struct stat *st,
                        bool writable, int64_t owner_uid, mbd_error *err) {
  if (!S_ISREG(st->st_mode))
    return mbd_error_set(err, MBD_E_INVALID, "shm %s is not a regular shared-memory object", name);
  if (c->shm_dev && st->st_dev != c->shm_dev)
    return mbd_error_set(err, MBD_E_INVALID, "shm %s is not on the /dev/shm file system", name);
  if (owner_uid < 0)
    return mbd_error_set(err, MBD_E_INVALID,
                         "shm %s: the requesting client's uid is unknown (shm refs work only for "
                         "clients connected to the broker over ipc:// on this host)", name);
  if ((uint64_t)st->st_uid != (uint64_t)owner_uid)
    return mbd_error_set(err, MBD_E_INVALID,
                         "shm %s belongs to uid %u, not to the requesting client (uid %lld): a "
                         "client may name only its own objects", name, (unsigned)st->st_uid,
                         (long long)owner_uid);
  if (!(st->st_mode & S_IRUSR) || (writable && !(st->st_mode & S_IWUSR)))
    return mbd_error_set(err, MBD_E_INVALID, "shm %s: its owner has no %s permission on it", name,
                         writable ? "write" : "read");
  return MBD_OK;
}

int mbd_shm_cache_map(mbd_shm_cache *c, const char *name, uint64_t offset, uint64_t size,
                      size_t need, bool writable, int64_t owner_uid, void **out, mbd_error *err) {
  *out = NULL;
  int rc = mbd_shm_name_check(name, err);
  if (rc) return rc;
  int fd = shm_open(name, (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return mbd_error_set(err, MBD_E_NOT_FOUND, "shm %s does not exist (create it with shm_open "
                           "before sending the request)", name);
    return mbd_error_set(err, e == EACCES || e == ELOOP ? MBD_E_INVALID : MBD_E_IO,
                         "shm %s: cannot open %s: %s", name, writable ? "read-write" : "read-only",
                         strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mbd_error_set(err, MBD_E_IO, "shm %s: fstat failed: %s", name, strerror(e));
  }
  if ((rc = check_object(c, name, &st, writable, owner_uid, err))) {
    close(fd);
    return rc;
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

  /* Hit: same name, same access, same object (inode) and same size, not poisoned. */
  shm_entry *victim = NULL;
  for (size_t i = 0; i < c->max; i++) {
    shm_entry *e = &c->e[i];
    if (!e->base) {
      if (!victim || victim->base) victim = e;
      continue;
    }
    if (e->writable == writable && !strcmp(e->name, name)) {
      if (!e->poisoned && e->dev == st.st_dev && e->ino == st.st_ino &&
          e->size == (size_t)objsize) {
        close(fd);
        e->last_use = ++c->clock;
        *out = (char *)e->base + offset;
        return MBD_OK;
      }
      entry_drop(e); /* stale: re-created, resized or truncated object */
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
  victim->last_use = ++c->clock;
  victim->base = base; /* last: the SIGBUS handler sees only complete entries */
  *out = (char *)base + offset;
  return MBD_OK;
}

void mbd_shm_cache_watch(mbd_shm_cache *c) {
  if (c) c->faulted = 0;
}

int mbd_shm_cache_check(mbd_shm_cache *c, mbd_error *err) {
  if (!c || !c->faulted) return MBD_OK;
  c->faulted = 0;
  return mbd_error_set(err, MBD_E_INVALID,
                       "shm %s shrank while the worker was using it (ftruncate during a request); "
                       "the request was not completed", c->fault_name);
}

size_t mbd_shm_cache_count(const mbd_shm_cache *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->max; i++) n += c->e[i].base != NULL;
  return n;
}

uint64_t mbd_shm_cache_maps(const mbd_shm_cache *c) { return c->maps; }
uint64_t mbd_shm_cache_faults(const mbd_shm_cache *c) { return c->faults; }
