#include "pkg/peer/peer_set.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pkg/util/bytes.h"

namespace weightcache::peer {
namespace {

absl::Status Bad(const std::string& entry, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("peer '", entry, "': ", why));
}

// The numeric form of `sa` ("10.0.0.7", "fd00::7"); empty for other families.
std::string NumericHost(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

std::string Dialable(const std::string& host, uint16_t port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

// This host's addresses, every interface's, loopback included.
std::set<std::string> LocalHosts() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (std::string h = NumericHost(i->ifa_addr); !h.empty()) out.insert(std::move(h));
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

absl::StatusOr<PeerName> ParsePeerName(const std::string& entry) {
  std::string host;
  std::string_view port;
  if (!entry.empty() && entry.front() == '[') {
    const size_t close = entry.find(']');
    if (close == std::string::npos) return Bad(entry, "'[' without ']'");
    host = entry.substr(1, close - 1);
    if (close + 1 >= entry.size() || entry[close + 1] != ':') {
      return Bad(entry, "no port (host:port, [IPv6]:port)");
    }
    port = std::string_view(entry).substr(close + 2);
  } else {
    const size_t colon = entry.rfind(':');
    if (colon == std::string::npos) return Bad(entry, "no port (host:port, [IPv6]:port)");
    host = entry.substr(0, colon);
    if (host.find(':') != std::string::npos) {
      return Bad(entry, "an IPv6 address is written [addr]:port");
    }
    port = std::string_view(entry).substr(colon + 1);
  }
  if (host.empty()) return Bad(entry, "no host");
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return Bad(entry, "the port is not a number in 1..65535");
  }
  return PeerName{std::move(host), static_cast<uint16_t>(value)};
}

absl::StatusOr<std::vector<PeerName>> ParsePeerList(const std::string& list) {
  std::vector<PeerName> out;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer list '", list, "': an empty entry (a stray comma?)"));
    }
    auto name = ParsePeerName(std::string(item));
    if (!name.ok()) return name.status();
    out.push_back(*std::move(name));
  }
  return out;
}

std::vector<std::string> PeerSet::Resolve(std::vector<PeerFailure>* failures) const {
  const std::set<std::string> local =
      options_.self_port != 0 ? LocalHosts() : std::set<std::string>{};
  std::set<std::string> out;
  for (const PeerName& p : options_.peers) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (const int rc = getaddrinfo(p.host.c_str(), nullptr, &hints, &res); rc != 0) {
      if (failures != nullptr) {
        failures->push_back({Dialable(p.host, p.port),
                             absl::UnavailableError(absl::StrCat(
                                 "peer ", p.host, ": does not resolve: ", gai_strerror(rc)))});
      }
      continue;
    }
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const std::string host = NumericHost(a->ai_addr);
      if (host.empty()) continue;
      if (p.port == options_.self_port && local.count(host) != 0) continue;
      out.insert(Dialable(host, p.port));
    }
    freeaddrinfo(res);
  }
  return {out.begin(), out.end()};
}

std::shared_ptr<PeerClient> PeerSet::ClientFor(const std::string& address) {
  MutexLock l(mu_);
  auto& c = clients_[address];
  if (c == nullptr) c = PeerClient::Make(address, options_.tls);
  return c;
}

void PeerSet::Forget(const std::string& address, const PeerClient* client) {
  MutexLock l(mu_);
  if (auto it = clients_.find(address); it != clients_.end() && it->second.get() == client) {
    clients_.erase(it);
  }
}

void PeerSet::KeepOnly(const std::vector<std::string>& addresses) {
  MutexLock l(mu_);
  for (auto it = clients_.begin(); it != clients_.end();) {
    it = std::binary_search(addresses.begin(), addresses.end(), it->first) ? std::next(it)
                                                                           : clients_.erase(it);
  }
}

PeerSurvey PeerSet::Survey(const std::string& fingerprint, bool transfer) {
  PeerSurvey survey;
  const std::vector<std::string> addresses = Resolve(&survey.failures);
  KeepOnly(addresses);
  std::vector<absl::StatusOr<v1::PeerDescribeResponse>> answers(addresses.size(),
                                                                absl::UnknownError("not asked"));
  std::vector<std::string> identities(addresses.size());
  // A fresh nonce per peer and call: the token a holder answers with is good for this call only.
  std::vector<std::string> nonces(addresses.size());
  if (!options_.identify_as.empty()) {
    for (auto& n : nonces) n = RandomHex(16);
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < addresses.size();) {
      std::shared_ptr<PeerClient> c = ClientFor(addresses[i]);
      answers[i] = c->Describe(fingerprint, options_.describe_timeout, transfer, &identities[i],
                               options_.identify_as, nonces[i]);
      const absl::StatusCode code = answers[i].status().code();
      if (code != absl::StatusCode::kOk && code != absl::StatusCode::kNotFound) {
        Forget(addresses[i], c.get());
      }
    }
  };
  const size_t threads =
      std::min(addresses.size(), static_cast<size_t>(std::max(1, options_.parallel)));
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (answers[i].ok()) {
      survey.holders.push_back({addresses[i], *std::move(answers[i]), identities[i], nonces[i]});
    } else if (answers[i].status().code() == absl::StatusCode::kNotFound) {
      survey.without.push_back(addresses[i]);
    } else {
      survey.failures.push_back({addresses[i], answers[i].status()});
    }
  }
  return survey;
}

}  // namespace weightcache::peer
