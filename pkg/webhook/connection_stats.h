// What the webhook's connection front has cut or refused so far (issue 47): vocabulary shared by
// the server (server.h) and its front (internal/front.h). Plain values, copied out.
#pragma once

#include <cstdint>

namespace weightcache::webhook {

struct ConnectionStats {
  uint64_t accepted = 0;
  uint64_t handshake_timeouts = 0;  // handshakes cut at handshake_timeout_ms
  uint64_t handshake_failures = 0;  // closed or refused by the client, or not TLS
  uint64_t request_timeouts = 0;    // requests cut at the request deadline
  uint64_t source_refusals = 0;     // closed at accept: their address had its limit open
  uint64_t requests = 0;            // handed to a worker
};

}  // namespace weightcache::webhook
