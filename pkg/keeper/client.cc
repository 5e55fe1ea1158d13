#include "pkg/keeper/client.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/keeper/wire.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::keeper {
namespace {

// The reply to a request: `want`, or the keeper's error.
absl::StatusOr<Message> Expect(int sock, Op want, const std::string& what) {
  WC_ASSIGN_OR_RETURN(Message m, RecvMessage(sock));
  WC_RETURN_IF_ERROR(StatusOf(m));
  if (m.op != want) {
    return absl::InternalError(absl::StrCat("keeper: answered ", OpName(m.op), " to ", what,
                                            " (expected ", OpName(want), ")"));
  }
  return m;
}

constexpr char kImpostorPayload[] = "type.weightcache.io/keeper-impostor-uid";

}  // namespace

std::optional<uid_t> KeeperClient::ImpostorUid(const absl::Status& s) {
  const auto p = s.GetPayload(kImpostorPayload);
  uint32_t uid = 0;
  if (!p || !absl::SimpleAtoi(std::string(*p), &uid)) return std::nullopt;
  return static_cast<uid_t>(uid);
}

absl::StatusOr<std::unique_ptr<KeeperClient>> KeeperClient::Connect(
    const std::string& path, std::chrono::milliseconds timeout, std::optional<uid_t> keeper_uid) {
  // A keeper that stopped accepting (frozen) fills its backlog: refused at once, not waited.
  auto sock = ConnectUnixNoWait(path, SOCK_SEQPACKET);
  if (!sock.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no keeper at ", path, ": ", sock.status().message()));
  }
  // The listener's credentials, recorded by the kernel when it called listen(): not
  // something the process at the other end can say otherwise.
  const uid_t want = keeper_uid.value_or(::geteuid());
  auto cred = GetPeerCred(sock->get());
  if (!cred.ok()) return cred.status();
  if (cred->uid != want) {
    absl::Status refused = absl::PermissionDeniedError(
        absl::StrCat(path, ": the keeper there runs as uid ", cred->uid, " (pid ", cred->pid,
                     "), not the expected uid ", want,
                     ": refused, nothing deposited with it or adopted from it"));
    refused.SetPayload(kImpostorPayload, absl::Cord(std::to_string(cred->uid)));
    return refused;
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  for (int opt : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    if (::setsockopt(sock->get(), SOL_SOCKET, opt, &tv, sizeof tv) != 0) {
      return ErrnoStatus(errno, "setsockopt timeout", path);
    }
  }
  WC_ASSIGN_OR_RETURN(Message hello, Expect(sock->get(), Op::kOk, "a connection"));
  if (hello.body != kGreeting) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a weightcache keeper of this version (greeted '",
                     hello.body.substr(0, 64), "', expected '", kGreeting, "')"));
  }
  return std::unique_ptr<KeeperClient>(new KeeperClient(std::move(sock).value()));
}

absl::Status KeeperClient::Deposit(const std::string& key, const std::string& body,
                                   const std::vector<int>& fds) {
  Message m = MessageOf(Op::kDeposit);
  m.key = key;
  m.body = body;
  m.nfds = static_cast<uint32_t>(fds.size());
  WC_RETURN_IF_ERROR(SendMessage(sock_.get(), m));
  WC_RETURN_IF_ERROR(Expect(sock_.get(), Op::kProceed, "a deposit").status());
  WC_RETURN_IF_ERROR(SendFds(sock_.get(), fds));
  return Expect(sock_.get(), Op::kOk, "a deposit's descriptors").status();
}

absl::Status KeeperClient::Drop(const std::string& key) {
  Message m = MessageOf(Op::kDrop);
  m.key = key;
  WC_RETURN_IF_ERROR(SendMessage(sock_.get(), m));
  return Expect(sock_.get(), Op::kOk, "a drop").status();
}

absl::StatusOr<std::vector<KeeperClient::Entry>> KeeperClient::Adopt() {
  WC_RETURN_IF_ERROR(SendMessage(sock_.get(), MessageOf(Op::kAdopt)));
  std::vector<Entry> out;
  while (true) {
    WC_ASSIGN_OR_RETURN(Message m, RecvMessage(sock_.get()));
    WC_RETURN_IF_ERROR(StatusOf(m));
    if (m.op == Op::kEnd) {
      if (m.body != std::to_string(out.size())) {
        return absl::DataLossError(absl::StrCat("keeper: adopt listed ", out.size(),
                                                " entries but its end says ", m.body));
      }
      return out;
    }
    if (m.op != Op::kEntry) {
      return absl::InternalError(
          absl::StrCat("keeper: answered ", OpName(m.op), " inside an adopt listing"));
    }
    Entry e;
    e.key = std::move(m.key);
    e.body = std::move(m.body);
    WC_ASSIGN_OR_RETURN(e.fds, RecvFds(sock_.get(), m.nfds));
    out.push_back(std::move(e));
  }
}

absl::StatusOr<std::string> KeeperClient::Stats() {
  WC_RETURN_IF_ERROR(SendMessage(sock_.get(), MessageOf(Op::kStats)));
  WC_ASSIGN_OR_RETURN(Message m, Expect(sock_.get(), Op::kOk, "stats"));
  return m.body;
}

}  // namespace weightcache::keeper
