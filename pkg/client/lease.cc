// A lease's life after Acquire (client.h): watched for corruption, re-attached after a daemon
// restart to the memory the keeper kept, detached and re-attached at the same addresses.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pkg/client/client.h"
#include "pkg/client/internal/rpc.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::client {

using internal::ClaimDescriptors;
using internal::FillAcquireRequest;
using internal::FromGrpc;
using internal::HandleSocketFor;
using internal::Manifest;
using internal::StubFor;

Lease::~Lease() {
  // Unmap first (cuda-vmm: unmap, release the imported handles, free the VA range, release
  // the context), then end the lease in the daemon by closing the handle connection: the
  // daemon never counts memory as unleased while this process still maps it.
  mapping_.reset();
  handle_conn_.reset();
}

const TensorView* Lease::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const char* LeaseStateName(LeaseState s) {
  switch (s) {
    case LeaseState::kClean:
      return "clean";
    case LeaseState::kCorrupt:
      return "corrupt";
    case LeaseState::kUnknown:
      return "unknown";
  }
  return "unknown";
}

void Lease::PollLocked(std::chrono::milliseconds timeout) const {
  if (!corrupt_.empty() || daemon_closed_ || !handle_conn_) return;
  pollfd p{handle_conn_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return;
  char buf[512];
  const ssize_t n = ::recv(handle_conn_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    daemon_closed_ = true;  // the daemon ended (or restarted): no more news comes here
    unknown_why_ = "the daemon connection is gone (the daemon ended or restarted)";
  } else if (n > 0) {
    events_.append(buf, static_cast<size_t>(n));
  }
  for (size_t nl; corrupt_.empty() && (nl = events_.find('\n')) != std::string::npos;) {
    const std::string line = events_.substr(0, nl);
    events_.erase(0, nl + 1);
    constexpr std::string_view kCorrupt = "EVENT corrupt ";
    if (line.rfind(kCorrupt, 0) == 0) corrupt_ = line.substr(kCorrupt.size());
  }
  if (events_.size() > 4096) events_.clear();  // not a line the protocol sends
}

bool Lease::ReattachLocked() const {
  const auto now = std::chrono::steady_clock::now();
  if (another_copy_ || now < next_reattach_) return false;
  next_reattach_ = now + std::chrono::seconds(1);
  struct stat st {};
  if (::stat(control_socket_.c_str(), &st) != 0) return false;  // not back yet
  // A channel of its own: the client's may be in its reconnect back-off for seconds.
  auto stub = StubFor(control_socket_);
  v1::AcquireRequest req;
  req.set_fingerprint(fingerprint_);
  req.mutable_layout()->set_tp_size(static_cast<uint32_t>(tp_size_));
  req.mutable_layout()->set_tp_rank(static_cast<uint32_t>(tp_rank_));
  req.mutable_layout()->set_pp_size(static_cast<uint32_t>(pp_size_));
  req.mutable_layout()->set_pp_rank(static_cast<uint32_t>(pp_rank_));
  req.mutable_env()->set_device_uuid(device_uuid_);
  req.set_packed_manifest(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::AcquireResponse resp;
  if (absl::Status s = FromGrpc(ctx, stub->Acquire(&ctx, req, &resp), "Acquire"); !s.ok()) {
    unknown_why_ = absl::StrCat("the daemon connection is gone and no daemon serves it again yet (",
                                s.message(), ")");
    return false;
  }
  if (resp.content_id().empty() || resp.content_id() != content_id_) {
    // Another copy of these weights (no keeper kept ours): watching it says nothing of ours.
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ReleaseRequest rel;
    rel.set_lease_id(resp.lease_id());
    v1::ReleaseResponse rel_resp;
    (void)stub->Release(&rctx, rel, &rel_resp);
    another_copy_ = true;
    unknown_why_ = absl::StrCat(
        "the daemon that is back serves another copy of fingerprint ", fingerprint_, " (memory ",
        resp.content_id().empty() ? "unnamed" : resp.content_id(), ", this lease maps ",
        content_id_, "), so nobody watches the memory this process maps; acquire again");
    return false;
  }
  ScopedFd conn;
  auto fds = ClaimDescriptors(HandleSocketFor(control_socket_, resp.handle_socket()), resp.token(),
                              static_cast<size_t>(resp.segments_size()), &conn);
  if (!fds.ok()) {
    unknown_why_ = absl::StrCat("the daemon connection is gone; re-attaching failed: ",
                                fds.status().message());
    return false;
  }
  // The descriptors are of the memory mapped already: closed here, the connection kept.
  handle_conn_ = std::move(conn);
  daemon_closed_ = false;
  events_.clear();
  unknown_why_.clear();
  return true;
}

LeaseWatch Lease::Watch(std::chrono::milliseconds timeout) const {
  MutexLock l(check_mu_);
  if (detached_) {
    return {LeaseState::kUnknown,
            "the lease is detached (Detach): nothing is mapped and no daemon holds a lease for "
            "it; Reattach maps it again"};
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const bool was_attached = !daemon_closed_ && handle_conn_;
  PollLocked(timeout);
  if (corrupt_.empty() && (daemon_closed_ || !handle_conn_)) {
    // News is an event, the close, or the lease back: a call that saw the close returns with
    // it (after one try, when due); one that began unattached waits for a re-attach, trying
    // when each is due.
    bool back = ReattachLocked();
    while (!back && !was_attached && !another_copy_ &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_until(std::min(deadline, next_reattach_));
      back = ReattachLocked();
    }
    if (back) PollLocked(std::chrono::milliseconds(0));
  }
  // A corrupt verdict read before the connection closed stays the answer: it is the worse news.
  if (!corrupt_.empty()) return {LeaseState::kCorrupt, corrupt_};
  if (daemon_closed_ || !handle_conn_) {
    // Issue 48: this used to be clean forever, so an engine whose daemon restarted polled
    // "clean" on memory nobody scrubbed for it any more (and was never told of a corruption).
    return {LeaseState::kUnknown,
            unknown_why_.empty() ? std::string("the daemon connection is gone") : unknown_why_};
  }
  return {LeaseState::kClean, ""};
}

absl::Status Lease::Check(std::chrono::milliseconds timeout) const {
  const LeaseWatch w = Watch(timeout);
  switch (w.state) {
    case LeaseState::kClean:
      return absl::OkStatus();
    case LeaseState::kCorrupt:
      return absl::DataLossError(
          absl::StrCat("lease ", id_, " of model ", model_,
                       ": the daemon found its memory corrupt: ", w.message));
    case LeaseState::kUnknown:
      break;
  }
  return absl::UnavailableError(absl::StrCat(
      "lease ", id_, " of model ", model_, ": unknown: ", w.message,
      "; nobody tells this process about corruption of these weights until a daemon serving "
      "this memory is back; they stay mapped and readable"));
}

bool Lease::detached() const {
  MutexLock l(check_mu_);
  return detached_;
}

void Lease::ReleaseNow(const std::string& lease_id) const {
  auto stub = StubFor(control_socket_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  // Best effort: a daemon that is gone or ended the lease already needs nothing more, and the
  // closed handle connection ends it anyway.
  (void)stub->Release(&ctx, req, &resp);
}

absl::Status Lease::Detach() {
  MutexLock l(check_mu_);
  if (detached_) return absl::OkStatus();
  // Unmapped first: the daemon never counts memory as unleased while this process maps it.
  if (absl::Status s = mapping_->Detach(); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("Detach of lease ", id_, " (model ", model_, "): ", s.message()));
  }
  // Ended now, not when the daemon notices the closed connection: an Evict or a load under
  // the budget that follows finds the entry unleased.
  if (handle_conn_ && !daemon_closed_) ReleaseNow(id_);
  handle_conn_.reset();
  detached_ = true;
  events_.clear();
  return absl::OkStatus();
}

absl::Status Lease::Reattach(const ReattachOptions& o) {
  MutexLock l(check_mu_);
  if (!detached_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Reattach: lease ", id_, " of model ", model_, " is attached (Detach first)"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto stub = StubFor(control_socket_);
  google::protobuf::Arena arena;
  auto call = [&](const AcquireOptions& ask, v1::AcquireResponse* resp) {
    v1::AcquireRequest req;
    if (absl::Status s = FillAcquireRequest(ask, &req); !s.ok()) return s;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
    return FromGrpc(ctx, stub->Acquire(&ctx, req, resp), "Acquire");
  };
  const std::string what =
      absl::StrCat("re-attach of model '", model_, "' (fingerprint ", fingerprint_, ")");
  // By fingerprint: the very weights, if the daemon still (or again) holds them.
  AcquireOptions ask = asked_;
  ask.model.clear();
  ask.fingerprint = fingerprint_;
  ask.wait_ready = true;
  ask.load_on_miss = false;
  auto* resp = google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
  absl::Status s = call(ask, resp);
  if ((s.code() == absl::StatusCode::kNotFound ||
       s.code() == absl::StatusCode::kFailedPrecondition) &&
      !model_.empty()) {
    // Gone (evicted) or stale: by model name, as an Acquire would, loading when allowed.
    ask.fingerprint.clear();
    ask.model = model_;
    ask.load_on_miss = o.load_on_miss;
    resp = google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
    const absl::Status by_fp = s;
    s = call(ask, resp);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": by fingerprint: ", by_fp.message(),
                                                 "; by model name: ", s.message()));
    }
  } else if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  if (resp->fingerprint() != fingerprint_) {
    ReleaseNow(resp->lease_id());
    // The tail is a field diff as the daemon writes mismatches ("do not fit: field: cached X,
    // asked Y"), so every client reads it the same way.
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the daemon now serves fingerprint ", resp->fingerprint(), " for model '", model_,
        "', not ", fingerprint_,
        " that this lease mapped, so the lease stays detached (its tensors' addresses hold the "
        "old weights' layout; acquire the new weights as a new lease): the weights do not fit: "
        "fingerprint: cached ",
        resp->fingerprint(), ", asked ", fingerprint_));
  }
  // The same fingerprint is the same layout; checked all the same, cheaply.
  std::vector<uint64_t> sizes;
  for (const auto& seg : resp->segments()) sizes.push_back(seg.size());
  absl::Status same = sizes == segment_sizes_
                          ? absl::OkStatus()
                          : absl::InternalError(absl::StrCat(what,
                                                             ": the daemon's segments differ from "
                                                             "the detached ones"));
  if (same.ok()) {
    auto manifest = Manifest(*resp, &arena);
    same = manifest.status();
    if (same.ok() && static_cast<size_t>((*manifest)->size()) != tensors_.size()) {
      same = absl::InternalError(
          absl::StrCat(what, ": ", (*manifest)->size(), " tensors, not ", tensors_.size()));
    }
    for (int i = 0; same.ok() && i < (*manifest)->size(); ++i) {
      const v1::TensorEntry& t = (*manifest)->Get(i);
      const TensorView* v = Find(t.name());
      if (v == nullptr || v->segment != t.segment() || v->offset != t.offset() ||
          v->nbytes != t.nbytes()) {
        same = absl::InternalError(
            absl::StrCat(what, ": tensor '", t.name(), "' lies elsewhere than before"));
      }
    }
  }
  if (!same.ok()) {
    ReleaseNow(resp->lease_id());
    return same;
  }
  const auto t1 = std::chrono::steady_clock::now();
  ScopedFd conn;
  auto fds = ClaimDescriptors(HandleSocketFor(control_socket_, resp->handle_socket()),
                              resp->token(), sizes.size(), &conn);
  if (!fds.ok()) {
    ReleaseNow(resp->lease_id());
    return absl::Status(fds.status().code(), absl::StrCat(what, ": ", fds.status().message()));
  }
  const auto t2 = std::chrono::steady_clock::now();
  if (absl::Status m = mapping_->Reattach(std::move(fds).value(), sizes); !m.ok()) {
    ReleaseNow(resp->lease_id());
    return absl::Status(m.code(), absl::StrCat(what, ": ", m.message()));
  }
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t3 = std::chrono::steady_clock::now();
  timings_ = {};
  timings_.rpc_ms = ms(t0, t1);
  timings_.claim_ms = ms(t1, t2);
  timings_.map.map_ms = ms(t2, t3);
  map_seconds_ = ms(t0, t3) / 1000.0;
  id_ = resp->lease_id();
  content_id_ = resp->content_id();
  handle_conn_ = std::move(conn);
  detached_ = false;
  daemon_closed_ = false;
  another_copy_ = false;
  events_.clear();
  corrupt_.clear();
  unknown_why_.clear();
  return absl::OkStatus();
}

}  // namespace weightcache::client
