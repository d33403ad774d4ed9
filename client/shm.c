/* POSIX shared-memory regions for zero-copy host tensors.
 *
 * The client creates and owns the object; requests name it ("/mambad-...") with
 * an offset and size, and a worker on the same host maps it instead of
 * receiving the bytes inline. Names are unique per process and call because
 * workers cache mappings by name. */
#include "client/mambad.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/protocol.h"

struct mbd_shm {
  char name[MBD_SHM_NAME_MAX]; /* "/name" */
  void *data;                  /* mapping of the whole object */
  size_t size;
};

static int valid_name(const char *n) {
  size_t len = strlen(n);
  if (len < 2 || len >= MBD_SHM_NAME_MAX || n[0] != '/') return 0;
  return strchr(n + 1, '/') == NULL;
}

int mbd_shm_create(const char *name, size_t size, mbd_shm **out, mbd_error *err) {
  static atomic_uint counter; /* only makes names unique; no other state */
  *out = NULL;
  if (size == 0) return mbd_error_set(err, MBD_E_INVALID, "shm region size must be > 0");
  mbd_shm *s = calloc(1, sizeof *s);
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "out of memory allocating a shm handle");
  int fd = -1, rc = 0;
  if (name) {
    if (!valid_name(name)) {
      rc = mbd_error_set(err, MBD_E_INVALID,
                         "shm name '%s' must look like /name (one leading slash, under %d bytes)",
                         name, MBD_SHM_NAME_MAX);
      goto fail;
    }
    snprintf(s->name, sizeof s->name, "%s", name);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(s->name, sizeof s->name, "/mambad-%d-%u-%lx", (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long)ts.tv_nsec);
  }
  fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    rc = mbd_error_set(err, MBD_E_IO, "creating shm %s: %s", s->name, strerror(errno));
    goto fail;
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    rc = mbd_error_set(err, MBD_E_IO, "sizing shm %s to %zu bytes: %s", s->name, size,
                       strerror(errno));
    goto fail;
  }
  s->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (s->data == MAP_FAILED) {
    s->data = NULL;
    rc = mbd_error_set(err, MBD_E_IO, "mapping shm %s: %s", s->name, strerror(errno));
    goto fail;
  }
  s->size = size;
  close(fd);
  *out = s;
  return 0;
fail:
  if (fd >= 0) {
    close(fd);
    shm_unlink(s->name);
  }
  free(s);
  return rc;
}

void mbd_shm_destroy(mbd_shm **ps) {
  if (!ps || !*ps) return;
  mbd_shm *s = *ps;
  if (s->data) munmap(s->data, s->size);
  shm_unlink(s->name);
  free(s);
  *ps = NULL;
}

void *mbd_shm_data(const mbd_shm *s) { return s->data; }
size_t mbd_shm_size(const mbd_shm *s) { return s->size; }
const char *mbd_shm_name(const mbd_shm *s) { return s->name; }

int mbd_shm_tensor(const mbd_shm *s, uint64_t offset, const mbd_tensor_desc *desc,
                   mbd_tensor_in *out, mbd_error *err) {
  mbd_tensor_desc d = *desc; /* desc may point into *out */
  memset(out, 0, sizeof *out);
  size_t nb = 0;
  int rc = mbd_tensor_desc_nbytes(&d, &nb, err);
  if (rc != 0) return rc;
  if (offset > s->size || nb > s->size - offset)
    return mbd_error_set(err, MBD_E_INVALID,
                         "%zu bytes at offset %" PRIu64 " do not fit shm region %s of %zu bytes",
                         nb, offset, s->name, s->size);
  out->desc = d;
  out->shm = s;
  out->offset = offset;
  return 0;
}
