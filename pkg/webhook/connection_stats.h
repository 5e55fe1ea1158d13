// What the webhook's connection front has cut or refused so far (issue 47): vocabulary shared by
// the server (server.h) and its front (internal/front.h). Plain values, copied out.
#pragma once

#include <cstdint>

namespace weightcache::webhook {

struct ConnectionStats {
  uint64_t accepted = 0;
  uint64_t handshake_timeouts = 0;   // handshakes cut at handshake_timeout_ms
  uint64_t handshake_failures = 0;   // closed or refused by the client, or not TLS
  uint64_t request_timeouts = 0;     // requests cut at the request deadline
  uint64_t source_refusals = 0;      // closed at accept: their address had its limit open
  uint64_t total_refusals = 0;       // closed at accept, or cut in its handshake for a newcomer:
                                     // max_connections open
  uint64_t descriptor_backoffs = 0;  // accepting paused 100 ms: out of descriptors
  uint64_t idle_closes = 0;          // kept alive with no request past idle_timeout_ms: ended
                                     // by the acceptor
  uint64_t requests = 0;             // handed to a worker
  // Answered by the loop and closed, never handed to a worker:
  uint64_t refused_heads = 0;    // 4xx at the head: chunked, Expect, no length, too large, bad
  uint64_t queue_refusals = 0;   // 503: their address had max_queued_per_source waiting
  uint64_t queue_timeouts = 0;   // 503: waited for a worker past queue_deadline_ms
  uint64_t buffer_cuts = 0;      // 503: the largest request being read when the budget was full
  uint64_t answer_timeouts = 0;  // closed: the client did not take its answer in time
  // Now, not counts:
  uint64_t waiting = 0;         // whole requests waiting for a worker
  uint64_t buffered_bytes = 0;  // of requests and answers, against buffer_budget_bytes
};

}  // namespace weightcache::webhook
