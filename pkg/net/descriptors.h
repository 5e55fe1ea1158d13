// Out of descriptors: which errors mean it, and whether `n` more can be had now. The acceptor
// backs off on them; the peer port checks its headroom before handing a connection to gRPC.
// Thread-safety: free functions; DescriptorHeadroom takes and gives back descriptors at once.
#pragma once

namespace weightcache::net {

// EMFILE and the errors that mean the same for accept(2) and socket(2).
bool IsOutOfDescriptors(int err);
// 0 when `n` more descriptors can be had now (taken, as duplicates of `any_fd`, and given
// back at once), else the errno of the one that could not.
int DescriptorHeadroom(int any_fd, int n);

}  // namespace weightcache::net
