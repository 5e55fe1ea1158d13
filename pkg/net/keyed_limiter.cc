#include "pkg/net/keyed_limiter.h"

#include <utility>

#include "pkg/util/mutex.h"

namespace weightcache::net {

struct KeyedLimiter::State {
  Mutex mu;
  std::map<std::string, uint64_t> per_key ABSL_GUARDED_BY(mu);
  uint64_t total ABSL_GUARDED_BY(mu) = 0;

  void Give(const std::string& key, uint64_t amount) {
    MutexLock l(mu);
    total -= amount;
    auto it = per_key.find(key);
    if (it != per_key.end() && (it->second -= amount) == 0) per_key.erase(it);
  }
};

const char* KeyedLimiter::VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kWithin:
      return "within";
    case Verdict::kOverCap:
      return "over_cap";
    case Verdict::kRefusedTotal:
      return "total";
    case Verdict::kRefusedKey:
      return "per_key";
  }
  return "?";
}

KeyedLimiter::KeyedLimiter(Limits limits)
    : limits_(std::move(limits)), state_(std::make_shared<State>()) {}

KeyedLimiter::~KeyedLimiter() = default;

namespace {
// a + b > cap, without overflow.
bool Passes(uint64_t a, uint64_t b, uint64_t cap) { return a > cap || b > cap - a; }
}  // namespace

KeyedLimiter::Claim KeyedLimiter::Take(const std::string& key, uint64_t amount) {
  Claim c;
  MutexLock l(state_->mu);
  auto it = state_->per_key.find(key);
  const uint64_t mine = it == state_->per_key.end() ? 0 : it->second;
  c.key_held = mine;
  c.total_held = state_->total;
  if (Passes(state_->total, amount, limits_.total)) {
    c.verdict = Verdict::kRefusedTotal;
    return c;
  }
  const uint64_t cap = CapOf(key);
  const uint64_t band =
      Passes(cap, limits_.over_cap, kUnbounded) ? kUnbounded : cap + limits_.over_cap;
  if (Passes(mine, amount, band)) {
    c.verdict = Verdict::kRefusedKey;
    return c;
  }
  c.verdict = Passes(mine, amount, cap) ? Verdict::kOverCap : Verdict::kWithin;
  state_->per_key[key] = mine + amount;
  state_->total += amount;
  c.key_held = mine + amount;
  c.total_held = state_->total;
  c.slot = Slot(state_, key, amount);
  return c;
}

uint64_t KeyedLimiter::HeldBy(const std::string& key) const {
  MutexLock l(state_->mu);
  auto it = state_->per_key.find(key);
  return it == state_->per_key.end() ? 0 : it->second;
}

uint64_t KeyedLimiter::CapOf(const std::string& key) const {
  auto it = limits_.own_caps.find(key);
  return it == limits_.own_caps.end() ? limits_.per_key : it->second;
}

uint64_t KeyedLimiter::Total() const {
  MutexLock l(state_->mu);
  return state_->total;
}

size_t KeyedLimiter::Keys() const {
  MutexLock l(state_->mu);
  return state_->per_key.size();
}

KeyedLimiter::Slot::Slot(std::shared_ptr<State> state, std::string key, uint64_t amount)
    : state_(std::move(state)), key_(std::move(key)), amount_(amount) {}

KeyedLimiter::Slot::Slot(Slot&& o) noexcept
    : state_(std::move(o.state_)), key_(std::move(o.key_)), amount_(std::exchange(o.amount_, 0)) {}

KeyedLimiter::Slot& KeyedLimiter::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Reset();
    state_ = std::move(o.state_);
    key_ = std::move(o.key_);
    amount_ = std::exchange(o.amount_, 0);
  }
  return *this;
}

void KeyedLimiter::Slot::Reset() {
  if (state_ == nullptr) return;
  state_->Give(key_, amount_);
  state_.reset();
  amount_ = 0;
}

}  // namespace weightcache::net
