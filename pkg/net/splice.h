// Splice: the one byte relay between a client's socket and an inner one (gRPC's end of a
// socket pair or of a Unix connection). The control socket's relay and the peer port both
// move their bytes with it; what they add is what they read in the bytes as they pass
// (HTTP/2 frame headers, TLS records) and when they close. Each direction is buffered up to
// `capacity` bytes, allocated when bytes first come and, with `lazy_buffers`, given back
// whenever it empties (an idle connection costs no buffer: the peer port's many idle ones);
// a full buffer stops reading its source (back-pressure). Non-blocking sockets only.
//
// Thread-safety: none; one loop thread owns a Splice. Lifetimes: the Splice owns both
// sockets; destroying it closes them (the inner side then sees its end close).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "pkg/net/activity.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::net {

// One direction's bytes in flight: read from a source into the buffer, written on.
class Pipe {
 public:
  // `lazy`: the buffer exists only while bytes are in it (an idle connection costs none);
  // otherwise it is kept once allocated (no allocation per burst on a busy connection).
  Pipe(size_t capacity, bool lazy) : capacity_(capacity), lazy_(lazy) {}
  bool room() const { return end_ < capacity_; }
  bool empty() const { return begin_ == end_; }
  // Reads from `fd` into the free space: >0 bytes read (then last(n) are they), 0 end of file,
  // <0 nothing now (-EAGAIN) or an error (-errno).
  ssize_t ReadFrom(int fd);
  // The last `n` bytes read.
  const char* last(size_t n) const { return buf_.get() + end_ - n; }
  // Writes what is buffered to `fd`; false on an error other than "would block". An emptied
  // lazy pipe gives its buffer back.
  bool WriteTo(int fd);
  // Drops what is buffered, and the buffer.
  void Clear();

 private:
  // Nothing left in it: the buffer goes when lazy.
  void Empty();

  size_t capacity_;
  bool lazy_;
  std::unique_ptr<char[]> buf_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

class Splice {
 public:
  Splice(ScopedFd client, size_t capacity, bool lazy_buffers)
      : client_(std::move(client)), up_(capacity, lazy_buffers), down_(capacity, lazy_buffers) {}
  // The inner socket; until it is set, the client's bytes wait in the buffer.
  void SetInner(ScopedFd inner) { inner_ = std::move(inner); }
  // The client connection's activity (the acceptor's idle timeout): touched whenever bytes
  // move either way; held with the client's socket and let go before it closes.
  void SetActivity(ActivityHandle activity) { activity_ = std::move(activity); }
  const ActivityHandle& activity() const { return activity_; }

  // Sees the bytes as they pass: the client's (false stops the splice: the bytes that broke
  // a rule are never passed on) and the inner side's.
  struct Inspect {
    std::function<bool(const char* data, size_t n)> from_client;
    std::function<void(const char* data, size_t n)> from_inner;
  };
  // Moves what can move without blocking, both ways. False when the splice is over: the
  // client went (or broke a rule: `from_client` said so), or the inner side closed and what
  // it sent has reached the client.
  bool Pump(const Inspect& inspect);

  // Level-triggered epoll interest from the buffers' state: read a side only while its
  // buffer has room, wait for writability only while there is something to write.
  uint32_t ClientEvents() const;
  uint32_t InnerEvents() const;

  // The inner side closed its end (or a write to it failed): flush to the client, then over.
  void InnerDone() { inner_done_ = true; }
  bool inner_done() const { return inner_done_; }
  const ScopedFd& client() const { return client_; }
  const ScopedFd& inner() const { return inner_; }
  bool client_pending() const { return !up_.empty(); }  // client bytes not yet passed on

 private:
  // Pump's moves; `any` set when a byte was read from either side.
  bool Move(const Inspect& inspect, bool& any);

  ScopedFd client_;
  ActivityHandle activity_;  // after client_: let go before the client's socket closes
  ScopedFd inner_;
  Pipe up_;    // client -> inner
  Pipe down_;  // inner -> client
  bool inner_done_ = false;
};

}  // namespace weightcache::net
