/* This machine's host id: what workers report and clients send so the broker
 * can tell which peers share a host (POSIX shm and CUDA IPC only work there).
 * One definition, so a client and a worker on one machine always agree. */
#ifndef MBD_HOST_ID_H
#define MBD_HOST_ID_H

#include <stddef.h>

/* Writes /etc/machine-id (first line), else the hostname, else "unknown-host"
 * into buf (always NUL-terminated when cap > 0). */
void mbd_host_id_get(char *buf, size_t cap);

#endif
