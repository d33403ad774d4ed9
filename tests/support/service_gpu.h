/* For tests/gpu/test_service_gpu*.c and the service bench: GPU workers under
 * the worker harness, sending many requests at once and collecting their
 * final replies by tag, and small request builders. */
#ifndef MBD_TEST_SERVICE_GPU_H
#define MBD_TEST_SERVICE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "support/wh_requests.h"
#include "support/worker_harness.h"

/* Number of CUDA devices (0 when none or no driver). */
int sg_device_count(void);

/* Exits 77 with a reason when fewer than `need` devices or the binaries or
 * fixtures are missing; else initialises h. */
void sg_init_or_skip(wh *h, int need);

/* A GPU worker on cuda:dev serving the tiny fixture in f32, deterministic. */
pid_t sg_start_gpu_worker(wh *h, const char *name, int dev, const char *capacity,
                          const char *max_batch);

/* EXPORT of session sid's state. */
uint64_t sg_send_export(wh *h, const char *sid);

/* IMPORT of an exported blob under its exact route id. */
uint64_t sg_send_import(wh *h, const void *blob, size_t n, const char *route_id);

/* Copy of the first payload of m (caller frees); *n its length. */
uint8_t *sg_payload(const mbd_msg *m, size_t *n);

/* splitmix64 step. */
uint64_t sg_rng(uint64_t *s);

#endif
