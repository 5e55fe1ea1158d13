// The open-file limit of a process that holds many descriptors (the daemon: connections,
// leases' segments, checkpoint files; the keeper: every cached segment).
// Thread-safety: call once at start, before other threads open descriptors.
#pragma once

#include <cstdint>

namespace weightcache {

// Raises the soft RLIMIT_NOFILE to the hard one, logs before/after, and returns the soft
// limit now in force.
uint64_t RaiseOpenFileLimit();

}  // namespace weightcache
