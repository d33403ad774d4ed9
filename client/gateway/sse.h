/* Server-Sent Events: a byte queue between the thread that generates
 * (producer) and libmicrohttpd's content reader (consumer, the connection's
 * thread). The consumer also watches the socket, so a client that hangs up
 * marks the stream gone even while nothing is being written; the producer
 * sees that and stops its generation. Memory is bounded: a producer that
 * gets more than GW_SSE_MAX_QUEUED bytes ahead of a slow reader waits, and
 * gives the client up after the idle timeout. Reference-counted: the
 * producer and the response each hold one reference. */
#ifndef MBD_GW_SSE_H
#define MBD_GW_SSE_H

#include <stdbool.h>
#include <stddef.h>

#define GW_SSE_MAX_QUEUED (4u << 20)

typedef struct gw_sse gw_sse;

/* fd: the connection's socket (watched for hang-up; -1 = none). */
gw_sse *gw_sse_new(int fd, int idle_timeout_s);
/* Queues "data: <json>\n\n". -1 once the client is gone. */
int gw_sse_data(gw_sse *s, const char *json);
/* Producer is done: the stream ends once the queue drains. */
void gw_sse_end(gw_sse *s);
bool gw_sse_gone(gw_sse *s);
/* A libmicrohttpd response reading from s (takes a reference); NULL on failure. */
struct MHD_Response *gw_sse_response(gw_sse *s);
/* Whether the peer of socket fd closed its end (or the socket failed): a
 * zero-timeout poll for POLLRDHUP/POLLHUP/POLLERR; false for fd < 0. */
bool gw_peer_gone(int fd);
/* Drops the caller's reference; NULL-safe, nulls *s. */
void gw_sse_unref(gw_sse **s);

#endif
