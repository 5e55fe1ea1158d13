// weightcached's peer-fill flags (peer_flags.cc): the peer API this daemon serves, the peers
// it asks, their TLS and how a holder's node is known (issue 57). Read once at start by
// OptionsFromFlags (flags.cc); every refusal names the flag.
#pragma once

#include "absl/status/status.h"
#include "pkg/server/options.h"

namespace weightcache {

absl::Status ReadPeerFlags(server::PeerOptions& out);

}  // namespace weightcache
