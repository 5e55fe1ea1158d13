// Queues taking turns: the vocabulary of reading several files side by side (a group load's
// staging buffers, scatter.cc; a lone host rank's reads, pieces.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

namespace weightcache::load::internal {

// The items of up to `width` queues at a time in turn: one item of each live queue, then the
// next round; a queue that empties makes room for the next one, in the order given. Each
// queue's items keep their order. `width` 0 counts as 1 (one queue after another).
template <typename T>
std::vector<T> InTurns(std::vector<std::deque<T>> queues, size_t width) {
  std::vector<T> out;
  std::vector<std::deque<T>*> live;
  auto next = queues.begin();
  for (;;) {
    while (live.size() < std::max<size_t>(1, width) && next != queues.end()) {
      if (!next->empty()) live.push_back(&*next);
      ++next;
    }
    if (live.empty()) break;
    for (auto* q : live) {
      out.push_back(std::move(q->front()));
      q->pop_front();
    }
    std::erase_if(live, [](auto* q) { return q->empty(); });
  }
  return out;
}

}  // namespace weightcache::load::internal
