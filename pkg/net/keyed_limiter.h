// KeyedLimiter: how much of a shared resource each key (a tenant unit, a source address, a
// uid) holds, and whether a new claim fits under the caps per key and in total. The one
// place where "per caller and bounded" is counted: connections of every listener (acceptor.h)
// and the artifact budget's reservations (bytes) use it, so a keying rule is written once.
//
// A claim that fits returns a Slot, the one owner of what it took: destroying (or Reset) it
// gives the amount back. A key may also hold a small band past its cap (`over_cap`): such
// claims are granted but marked, so the holder can tell its caller why it is refused (the
// control socket answers RESOURCE_EXHAUSTED on them) instead of closing in silence.
//
// Thread-safety: every method, and Slots, from any thread. Lifetimes: Slots keep the
// limiter's counts alive (shared), so a Slot may outlive the KeyedLimiter that issued it.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>

namespace weightcache::net {

class KeyedLimiter {
 public:
  static constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();
  struct Limits {
    uint64_t total = kUnbounded;    // all keys together
    uint64_t per_key = kUnbounded;  // one key, within its cap
    uint64_t over_cap = 0;          // a key may hold this much more, marked over its cap
    // Keys with a cap of their own in place of per_key (the one unit all unresolved peers
    // share: smaller).
    std::map<std::string, uint64_t> own_caps;
  };
  enum class Verdict {
    kWithin,        // taken
    kOverCap,       // taken, in the key's band past its cap
    kRefusedTotal,  // not taken: the total would pass its cap
    kRefusedKey,    // not taken: the key would pass its cap and its band
  };
  // "within" | "over_cap" | "total" | "per_key"
  static const char* VerdictName(Verdict v);

  class Slot;
  struct Claim;

  explicit KeyedLimiter(Limits limits);
  ~KeyedLimiter();
  KeyedLimiter(const KeyedLimiter&) = delete;
  KeyedLimiter& operator=(const KeyedLimiter&) = delete;

  // Takes `amount` for `key` when it fits (Claim::slot then holds it), else takes nothing.
  Claim Take(const std::string& key, uint64_t amount = 1);
  uint64_t HeldBy(const std::string& key) const;
  // The cap of `key`: its own, else per_key.
  uint64_t CapOf(const std::string& key) const;
  uint64_t Total() const;
  size_t Keys() const;  // keys holding anything
  const Limits& limits() const { return limits_; }

 private:
  struct State;
  const Limits limits_;
  std::shared_ptr<State> state_;
};

class KeyedLimiter::Slot {
 public:
  Slot() = default;
  Slot(Slot&& o) noexcept;
  Slot& operator=(Slot&& o) noexcept;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() { Reset(); }
  // Gives the amount back (idempotent).
  void Reset();
  bool held() const { return state_ != nullptr; }
  const std::string& key() const { return key_; }
  uint64_t amount() const { return amount_; }

 private:
  friend class KeyedLimiter;
  Slot(std::shared_ptr<State> state, std::string key, uint64_t amount);
  std::shared_ptr<State> state_;
  std::string key_;
  uint64_t amount_ = 0;
};

struct KeyedLimiter::Claim {
  Verdict verdict = Verdict::kRefusedTotal;
  Slot slot;              // held when verdict is kWithin or kOverCap
  uint64_t key_held = 0;  // what the key holds now (with this claim when taken)
  uint64_t total_held = 0;
  bool taken() const { return verdict == Verdict::kWithin || verdict == Verdict::kOverCap; }
};

}  // namespace weightcache::net
