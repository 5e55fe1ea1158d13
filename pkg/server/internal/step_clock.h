// Times the steps of the daemon's teardown, so a slow shutdown explains itself: a teardown
// longer than a second logs which steps it waited on (over 0.1 s each). Not a public header.
//
// Thread-safety: one thread (the teardown's).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace weightcache::server {

class StepClock {
 public:
  // Ends the step in progress, named `what`.
  void Step(std::string what);
  // Logs the total and, past a second, the slow steps; `last` names the last step's role
  // ("load threads joined").
  void Report(const std::string& last) const;

 private:
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point mark_ = t0_;
  std::vector<std::pair<std::string, double>> steps_;
};

}  // namespace weightcache::server
