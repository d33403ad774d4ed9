/* ipc:// endpoints the broker binds live in a directory only the service can
 * write, so nobody can replace a socket or squat the path first.
 *
 * Before binding, the socket's directory is created 0700 (0750 with a group)
 * when missing, or accepted only if it is a real directory (not a symlink)
 * owned by the broker's uid whose mode grants no more than that (group or
 * other write, or any other-access, is refused; narrower is widened to the
 * configured mode). After binding, the socket itself is chmod'ed 0600 (0660
 * with a group) and given the group. docs/security.md. */
#ifndef MBD_BROKER_IPCDIR_H
#define MBD_BROKER_IPCDIR_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/status.h"

/* The access an ipc endpoint gets: the service's uid only, or also a group. */
typedef struct mbd_ipc_access {
  bool has_group; /* false: 0700 / 0600 */
  gid_t gid;      /* with has_group: 0750 / 0660, this group */
} mbd_ipc_access;

/* Checks or creates the directory of ipc endpoint `ep` ("ipc:///dir/name");
 * not ipc: 0. MBD_E_INVALID naming the directory, its owner or mode and what
 * to do; MBD_E_IO when it cannot be created. */
int mbd_ipc_dir_prepare(const char *ep, const mbd_ipc_access *a, mbd_error *err);
/* Sets the bound socket's mode and group. Not ipc: 0. */
int mbd_ipc_socket_secure(const char *ep, const mbd_ipc_access *a, mbd_error *err);

#endif
