// The trailing metadata key the daemon sets on every error it answers itself. A client sees
// UNAVAILABLE both from the daemon (e.g. a preload still being opened: retry later) and from
// gRPC's transport (no daemon, or it went away mid-call: "Broken pipe", "Socket closed");
// only the daemon's own answers carry this key, so the client can tell "daemon unreachable"
// apart without matching gRPC's message texts.
#pragma once

namespace weightcache {

inline constexpr char kDaemonAnswerKey[] = "weightcache-answer";

}  // namespace weightcache
