#!/usr/bin/env bash
# pkg/server's layering (docs/architecture.md): the core (pkg/server/*.cc, internal/)
# composes the parts in its subfolders (wire/, policy/, messages/, keeper/, peer/,
# integrity/, publish/); a part never includes a header of the core, so it reaches the core only
# through interfaces it declares itself and builds, and is tested, without it. Tests in a
# subfolder may drive a whole daemon (pkg/server/testing/), production code may not.
# Also: no file in pkg/server, pkg/peer or cmd over 600 lines, and pkg/server/daemon.cc (the
# composition) at most 400. Fails listing what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files 'pkg/server/*/*.cc' 'pkg/server/*/*.h' |
  grep -v -e '^pkg/server/internal/' -e '^pkg/server/testing/' -e '_test\.cc$' |
  xargs grep -Hn -E '#include "pkg/server/([a-z_]+\.h|internal/|testing/)' || true)
if [[ -n $bad ]]; then
  echo "layering: a pkg/server subfolder includes the core's headers:" >&2
  echo "$bad" >&2
  exit 1
fi
# Test seams (pkg/server/testing: hooks, fixtures) are reached from tests only.
bad=$(git ls-files 'pkg/*.cc' 'pkg/*.h' 'cmd/*.cc' 'cmd/*.h' |
  grep -v -e '_test\.cc$' -e '/testing/' |
  xargs grep -Hn '#include "pkg/server/testing/' || true)
if [[ -n $bad ]]; then
  echo "layering: production code includes pkg/server/testing:" >&2
  echo "$bad" >&2
  exit 1
fi
# No file in pkg/server, pkg/peer or cmd over 600 lines (issue 46): split along a seam instead.
# (Functions there stay within 80 lines: their .clang-tidy.)
long=$(git ls-files 'pkg/server/*' 'pkg/peer/*' 'cmd/*' | grep -E '\.(cc|h)$' |
  xargs wc -l | awk '$2 != "total" && $1 > 600 { print $2 " (" $1 " lines)" }')
if [[ -n $long ]]; then
  echo "layering: files over 600 lines; split them along a seam:" >&2
  echo "$long" >&2
  exit 1
fi
# Units take narrow interfaces of what they use, never the daemon itself: only the composition
# (daemon.cc) and the gRPC adapter over its accessors (grpc_service.cc) see Daemon::Impl.
bad=$(git ls-files 'pkg/*.cc' 'pkg/*.h' 'cmd/*.cc' 'cmd/*.h' 'tests/*.cc' 'tests/*.h' |
  grep -v -e '^pkg/server/daemon\.cc$' -e '^pkg/server/grpc_service\.cc$' |
  xargs grep -Hn '#include "pkg/server/internal/daemon_impl.h"' || true)
if [[ -n $bad ]]; then
  echo "layering: only daemon.cc and grpc_service.cc may include internal/daemon_impl.h;" \
       "give the unit the narrow interface it uses instead:" >&2
  echo "$bad" >&2
  exit 1
fi
# The daemon's composition stays composition (docs/architecture.md): pkg/server/daemon.cc
# constructs, starts and tears down the units; what a unit does lives in the unit's file.
daemon_lines=$(wc -l <pkg/server/daemon.cc)
if ((daemon_lines > 400)); then
  echo "layering: pkg/server/daemon.cc is $daemon_lines lines (at most 400): move what is not" \
       "composition into the unit it belongs to" >&2
  exit 1
fi
echo "layering: pkg/server's subfolders include none of the core's headers; no production code includes pkg/server/testing; no file there over 600 lines; daemon.cc $daemon_lines lines (at most 400)"
