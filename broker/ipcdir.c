/* ipc socket directories owned by the service. See ipcdir.h. */
#include "broker/ipcdir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The socket path of an ipc endpoint, and its directory; false when not ipc. */
static bool split(const char *ep, char *path, char *dir, size_t cap) {
  if (strncmp(ep, "ipc://", 6) || ep[6] == '@') return false; /* '@': abstract namespace */
  snprintf(path, cap, "%s", ep + 6);
  snprintf(dir, cap, "%s", ep + 6);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, cap, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  return true;
}

int mbd_ipc_dir_prepare(const char *ep, const mbd_ipc_access *a, mbd_error *err) {
  char path[PATH_MAX], dir[PATH_MAX];
  if (!split(ep, path, dir, sizeof path)) return MBD_OK;
  mode_t want = a->has_group ? 0750 : 0700;
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (errno != ENOENT)
      return mbd_error_set(err, MBD_E_IO, "ipc directory %s of %s: %s", dir, ep, strerror(errno));
    if (mkdir(dir, want) != 0)
      return mbd_error_set(err, MBD_E_IO, "cannot create ipc directory %s for %s: %s", dir, ep,
                           strerror(errno));
    if (lstat(dir, &st) != 0)
      return mbd_error_set(err, MBD_E_IO, "ipc directory %s: %s", dir, strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    return mbd_error_set(err, MBD_E_INVALID,
                         "ipc directory %s of %s is not a directory (a symlink or a file): "
                         "remove it or choose another path",
                         dir, ep);
  if (st.st_uid != geteuid())
    return mbd_error_set(err, MBD_E_INVALID,
                         "ipc directory %s of %s belongs to uid %u, not to the service (uid %u): "
                         "someone else could replace the sockets; remove it or use a directory "
                         "of the service's own (e.g. $XDG_RUNTIME_DIR/mambad or /run/mambad)",
                         dir, ep, (unsigned)st.st_uid, (unsigned)geteuid());
  mode_t mode = st.st_mode & 07777;
  if (mode & ~want)
    return mbd_error_set(err, MBD_E_INVALID,
                         "ipc directory %s of %s has mode %04o, wider than %04o: others could "
                         "replace the sockets; chmod %o %s (or remove it)",
                         dir, ep, (unsigned)mode, (unsigned)want, (unsigned)want, dir);
  if (a->has_group && st.st_gid != a->gid && chown(dir, (uid_t)-1, a->gid) != 0)
    return mbd_error_set(err, MBD_E_IO, "cannot give ipc directory %s group %u: %s", dir,
                         (unsigned)a->gid, strerror(errno));
  if (mode != want && chmod(dir, want) != 0)
    return mbd_error_set(err, MBD_E_IO, "cannot chmod ipc directory %s: %s", dir, strerror(errno));
  return MBD_OK;
}

int mbd_ipc_socket_secure(const char *ep, const mbd_ipc_access *a, mbd_error *err) {
  char path[PATH_MAX], dir[PATH_MAX];
  if (!split(ep, path, dir, sizeof path)) return MBD_OK;
  if (a->has_group && chown(path, (uid_t)-1, a->gid) != 0)
    return mbd_error_set(err, MBD_E_IO, "cannot give socket %s group %u: %s", path,
                         (unsigned)a->gid, strerror(errno));
  if (chmod(path, a->has_group ? 0660 : 0600) != 0)
    return mbd_error_set(err, MBD_E_IO, "cannot chmod socket %s: %s", path, strerror(errno));
  return MBD_OK;
}
