#include "pkg/net/splice.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>

namespace weightcache::net {

ssize_t Pipe::ReadFrom(int fd) {
  if (!buf_) buf_.reset(new char[capacity_]);
  const ssize_t r = ::recv(fd, buf_.get() + end_, capacity_ - end_, MSG_DONTWAIT);
  if (r < 0) return -errno;
  end_ += static_cast<size_t>(r);
  if (empty()) Empty();  // nothing read
  return r;
}

bool Pipe::WriteTo(int fd) {
  while (!empty()) {
    const ssize_t w = ::send(fd, buf_.get() + begin_, end_ - begin_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) return errno == EAGAIN || errno == EINTR;
    begin_ += static_cast<size_t>(w);
  }
  Empty();
  return true;
}

void Pipe::Empty() {
  if (lazy_) {
    Clear();
  } else {
    begin_ = end_ = 0;
  }
}

void Pipe::Clear() {
  begin_ = end_ = 0;
  buf_.reset();
}

bool Splice::Pump(const Inspect& inspect) {
  bool moved = false;
  const bool on = Move(inspect, moved);
  if (moved) activity_.Touch();
  return on;
}

bool Splice::Move(const Inspect& inspect, bool& any) {
  auto gone = [](ssize_t r) { return r == 0 || (r < 0 && r != -EAGAIN && r != -EINTR); };
  for (bool moved = true; moved;) {
    moved = false;
    if (up_.room() && !inner_done_) {
      const ssize_t r = up_.ReadFrom(client_.get());
      if (gone(r)) return false;  // the client went
      if (r > 0) {
        if (inspect.from_client && !inspect.from_client(up_.last(r), static_cast<size_t>(r))) {
          return false;  // what broke the rule is never passed on
        }
        moved = any = true;
      }
    }
    if (!inner_) break;  // not handed over yet: the client's bytes wait
    if (!up_.empty() && !up_.WriteTo(inner_.get())) inner_done_ = true;
    if (inner_done_) up_.Clear();  // nobody left to read it
    if (down_.room() && !inner_done_) {
      const ssize_t r = down_.ReadFrom(inner_.get());
      if (gone(r)) {
        inner_done_ = true;
      } else if (r > 0) {
        if (inspect.from_inner) inspect.from_inner(down_.last(r), static_cast<size_t>(r));
        moved = any = true;
      }
    }
    if (!down_.empty() && !down_.WriteTo(client_.get())) return false;
  }
  return !(inner_done_ && down_.empty());
}

uint32_t Splice::ClientEvents() const {
  return (up_.room() && !inner_done_ ? static_cast<uint32_t>(EPOLLIN) : 0u) |
         (down_.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
}

uint32_t Splice::InnerEvents() const {
  return (down_.room() && !inner_done_ ? static_cast<uint32_t>(EPOLLIN) : 0u) |
         (up_.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
}

}  // namespace weightcache::net
