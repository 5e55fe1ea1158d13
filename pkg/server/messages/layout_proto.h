#pragma once
// A model-rank's placement (tensor- and pipeline-parallel size and rank) between the spec's
// struct and the wire's message: the one conversion the daemon's replies, its status and its
// keeper records share. Pure; any thread.

#include "pkg/spec/fingerprint.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

void LayoutToProto(const spec::Layout& layout, v1::Layout* out);
spec::Layout LayoutFromProto(const v1::Layout& layout);

}  // namespace weightcache::server
