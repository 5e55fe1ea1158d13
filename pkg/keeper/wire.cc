#include "pkg/keeper/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::keeper {
namespace {

constexpr char kMagic[4] = {'W', 'C', 'K', '1'};
constexpr char kFdByte = 'F';

void Put16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t Get(std::string_view d, size_t off, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(d[off + i])) << (8 * i);
  }
  return v;
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kDeposit:
      return "deposit";
    case Op::kProceed:
      return "proceed";
    case Op::kOk:
      return "ok";
    case Op::kError:
      return "error";
    case Op::kDrop:
      return "drop";
    case Op::kAdopt:
      return "adopt";
    case Op::kEntry:
      return "entry";
    case Op::kEnd:
      return "end";
    case Op::kStats:
      return "stats";
  }
  return "unknown";
}

absl::StatusOr<Header> ParseHeader(std::string_view data) {
  if (data.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keeper message: ", data.size(), " bytes, shorter than its header (", kHeaderBytes, ")"));
  }
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError("keeper message: bad magic (not a WCK1 peer)");
  }
  Header h{};
  const uint32_t op = Get(data, 4, 2);
  if (op < static_cast<uint32_t>(Op::kDeposit) || op > static_cast<uint32_t>(Op::kStats)) {
    return absl::InvalidArgumentError(absl::StrCat("keeper message: unknown op ", op));
  }
  h.op = static_cast<Op>(op);
  h.code = static_cast<int>(Get(data, 6, 2));
  if (h.code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat("keeper message: unknown status code ", h.code));
  }
  h.key_bytes = Get(data, 8, 4);
  h.body_bytes = Get(data, 12, 4);
  h.nfds = Get(data, 16, 4);
  if (h.key_bytes > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("keeper message: key of ", h.key_bytes,
                                                   " bytes, over the limit of ", kMaxKeyBytes));
  }
  if (h.body_bytes > kMaxBodyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("keeper message: body of ", h.body_bytes,
                                                   " bytes, over the limit of ", kMaxBodyBytes));
  }
  if (h.nfds > kMaxFdsPerEntry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keeper message: ", h.nfds, " descriptors, over the limit of ", kMaxFdsPerEntry));
  }
  return h;
}

absl::Status SendMessage(int sock, const Message& m) {
  if (m.key.size() > kMaxKeyBytes || m.body.size() > kMaxBodyBytes || m.nfds > kMaxFdsPerEntry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keeper message ", OpName(m.op), " '", m.key.substr(0, 64), "': too large (key ",
        m.key.size(), " bytes, body ", m.body.size(), " bytes, ", m.nfds, " descriptors)"));
  }
  std::string data(kMagic, sizeof kMagic);
  data.reserve(kHeaderBytes + m.key.size() + m.body.size());
  Put16(&data, static_cast<uint16_t>(m.op));
  Put16(&data, static_cast<uint16_t>(m.code));
  Put32(&data, static_cast<uint32_t>(m.key.size()));
  Put32(&data, static_cast<uint32_t>(m.body.size()));
  Put32(&data, m.nfds);
  Put32(&data, 0);  // reserved
  data += m.key;
  data += m.body;
  for (size_t off = 0; off < data.size(); off += kMaxChunkBytes) {
    WC_RETURN_IF_ERROR(SendWithFds(sock, data.substr(off, kMaxChunkBytes), {}));
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> RecvMessage(int sock) {
  WC_ASSIGN_OR_RETURN(Received first, RecvWithFds(sock, kMaxChunkBytes));
  if (!first.fds.empty()) {
    return absl::InvalidArgumentError("keeper message: descriptors arrived with a header");
  }
  WC_ASSIGN_OR_RETURN(Header h, ParseHeader(first.data));
  const size_t total = kHeaderBytes + h.key_bytes + h.body_bytes;
  std::string data = std::move(first.data);
  if (data.size() > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper message: ", data.size(), " bytes where its header says ", total));
  }
  data.reserve(total);
  while (data.size() < total) {
    WC_ASSIGN_OR_RETURN(Received more, RecvWithFds(sock, kMaxChunkBytes));
    if (!more.fds.empty() || data.size() + more.data.size() > total) {
      return absl::InvalidArgumentError(absl::StrCat("keeper message ", OpName(h.op),
                                                     ": a continuation overruns its ", total,
                                                     " bytes or carries descriptors"));
    }
    data += more.data;
  }
  Message m;
  m.op = h.op;
  m.code = h.code;
  m.nfds = h.nfds;
  m.key = data.substr(kHeaderBytes, h.key_bytes);
  m.body = data.substr(kHeaderBytes + h.key_bytes);
  return m;
}

absl::Status SendFds(int sock, const std::vector<int>& fds) {
  const std::string byte(1, kFdByte);
  for (size_t off = 0; off < fds.size(); off += kMaxFdsPerMessage) {
    const size_t n = std::min(kMaxFdsPerMessage, fds.size() - off);
    WC_RETURN_IF_ERROR(
        SendWithFds(sock, byte, std::vector<int>(fds.begin() + off, fds.begin() + off + n)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ScopedFd>> RecvFds(int sock, uint32_t n) {
  std::vector<ScopedFd> out;
  out.reserve(n);
  while (out.size() < n) {
    auto r = RecvWithFds(sock, 1);
    if (!r.ok()) {
      if (r.status().code() == absl::StatusCode::kResourceExhausted) {
        return absl::ResourceExhaustedError(
            absl::StrCat("keeper: descriptors dropped by the kernel after ", out.size(), " of ", n,
                         " (this process is at its open-file limit)"));
      }
      return r.status();
    }
    if (r->data != std::string(1, kFdByte) || r->fds.empty() || out.size() + r->fds.size() > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keeper: expected a descriptor datagram (", out.size(), " of ", n, " received), got ",
          r->data.size(), " bytes with ", r->fds.size(), " descriptors"));
    }
    for (auto& fd : r->fds) out.push_back(std::move(fd));
  }
  return out;
}

Message ErrorMessage(const absl::Status& s) {
  Message m;
  m.op = Op::kError;
  m.code = static_cast<int>(s.code());
  m.body = std::string(s.message()).substr(0, 4000);
  return m;
}

absl::Status StatusOf(const Message& m) {
  if (m.op != Op::kError) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(m.code);
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  return absl::Status(code, absl::StrCat("keeper: ", m.body));
}

}  // namespace weightcache::keeper
