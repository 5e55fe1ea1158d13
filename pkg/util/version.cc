#include "pkg/util/version.h"

namespace weightcache {

const char* Version() { return WEIGHTCACHE_VERSION; }

}  // namespace weightcache
