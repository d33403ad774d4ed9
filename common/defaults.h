/* The one table of defaults and limits that the broker, the worker and the
 * deployment reader share, so a knob means one thing with one default in
 * every process. Each entry: what it is, its unit, where it is set. */
#ifndef MBD_DEFAULTS_H
#define MBD_DEFAULTS_H

/* Heartbeat interval, ms, both ways (--heartbeat-ms, broker.heartbeat_ms). */
#define MBD_DEFAULT_HEARTBEAT_MS 1000
#define MBD_HEARTBEAT_MS_MIN 10
#define MBD_HEARTBEAT_MS_MAX 600000
/* Silent heartbeat intervals before a peer counts as dead (--liveness, broker.liveness). */
#define MBD_DEFAULT_LIVENESS 3
#define MBD_LIVENESS_MAX 1000
/* Largest message any process accepts, MiB (--max-message-mb, broker.max_message_mb):
 * ZMQ_MAXMSGSIZE and the receive cap of the broker and of every worker. */
#define MBD_DEFAULT_MAX_MESSAGE_MB 2048
#define MBD_MAX_MESSAGE_MB_MAX 65536
/* Deadline of a request that names none, ms (--default-deadline-ms,
 * broker.default_deadline_ms), and the most a request may ask for. */
#define MBD_DEFAULT_DEADLINE_MS 60000
#define MBD_DEADLINE_MS_MAX (24LL * 3600 * 1000)
/* Broker queue: requests waiting for capacity (--queue-limit, broker.queue_limit)
 * and the bytes (bodies + payloads) they may hold, MiB (--queue-mb, broker.queue_mb). */
#define MBD_DEFAULT_QUEUE_LIMIT 1024
#define MBD_QUEUE_LIMIT_MAX 10000000
#define MBD_DEFAULT_QUEUE_MB 512
#define MBD_QUEUE_MB_MAX (1 << 20)
/* ZeroMQ SNDHWM/RCVHWM of the broker's sockets (--hwm). */
#define MBD_DEFAULT_HWM 10000
/* In-flight capacity: requests a worker runs at once, the broker's load
 * accounting (worker --capacity, workers[].capacity, READY capacity). */
#define MBD_DEFAULT_CAPACITY 64
#define MBD_CAPACITY_MAX 4096
/* Session slots: sessions a worker holds (worker --sessions, workers[].sessions;
 * the route's state_capacity). When not given, the in-flight capacity. */
#define MBD_SESSIONS_MAX (1 << 20)
/* Rows per batched step (worker --max-batch, workers[].max_batch). */
#define MBD_DEFAULT_MAX_BATCH 64
#define MBD_MAX_BATCH_MAX 4096
/* Idle session expiry, s (worker --session-idle-s, workers[].session_idle_s). */
#define MBD_DEFAULT_SESSION_IDLE_S 600
/* Most tokens one FORWARD or PREFILL slice computes before live sessions'
 * steps get their turn (worker --slice-tokens). */
#define MBD_DEFAULT_SLICE_TOKENS 512
/* Prefix state cache: host memory per model, MiB (worker --prefix-cache-mb; 0 = off), and
 * the block size of its boundaries, tokens (worker --prefix-block; 0 = off; libmambad
 * hashes a prompt's blocks at this size for the broker's prefix routing). */
#define MBD_DEFAULT_PREFIX_CACHE_MB 256
#define MBD_PREFIX_CACHE_MB_MAX (1 << 20)
/* Its device tier on GPU workers, device memory per model, MiB (worker
 * --prefix-cache-device-mb; 0 = host memory only): allocated as entries need it. */
#define MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB 1024
#define MBD_DEFAULT_PREFIX_BLOCK 256
#define MBD_PREFIX_BLOCK_MAX (1 << 24)
/* The broker prefers the worker holding a request's longest cached prefix
 * while that worker's in-flight load is under this percentage of its capacity. */
#define MBD_PREFIX_ROUTE_LOAD_PCT 75
/* Grace for work already on its way after SIGTERM, ms (worker --drain-ms). */
#define MBD_DEFAULT_DRAIN_MS 5000
/* Durable sessions: a worker checkpoints a session's state to the broker after
 * this many consumed tokens (worker --checkpoint-tokens) or this many ms with
 * tokens consumed since the last one (worker --checkpoint-ms); 0 = off. */
#define MBD_DEFAULT_CHECKPOINT_TOKENS 0
#define MBD_DEFAULT_CHECKPOINT_MS 0
/* Bytes of session checkpoints the broker holds, MiB (broker --durable-mb);
 * 0 = the broker keeps none (sessions die with their worker). */
#define MBD_DEFAULT_DURABLE_MB 1024
/* Tokens the broker logs per session since its last checkpoint; past it the
 * session is not durable until its next checkpoint. */
#define MBD_DURABLE_LOG_MAX 65536
/* Largest --checkpoint-ms a worker and --durable-mb the broker accept. */
#define MBD_CHECKPOINT_MS_MAX 3600000
#define MBD_DURABLE_MB_MAX (1 << 24)

#endif
