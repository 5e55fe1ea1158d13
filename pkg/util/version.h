// The version of weightcache, from the repository's VERSION file (set at configure time).
// Thread-safety: any thread; the string lives for the whole process.
#pragma once

namespace weightcache {

// e.g. "0.1.0".
const char* Version();

}  // namespace weightcache
