// Starting a real weightcached for a test and waiting, bounded, until it serves: shared by
// the multi-process tests. Polls a condition with a deadline; never sleeps to synchronise.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/process.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::testing {

struct StartedDaemon {
  std::unique_ptr<Process> process;
  std::unique_ptr<client::Client> client;  // connected to its control socket
};

// Runs `argv` (weightcached and its flags, including --socket_dir=`socket_dir`) with stderr
// in `log_path`, then polls Status until `ready` holds for it (default: Status answers).
// DEADLINE_EXCEEDED carrying the daemon's log when `timeout` passes first.
absl::StatusOr<StartedDaemon> StartDaemon(
    const std::vector<std::string>& argv, const std::string& socket_dir,
    const std::string& log_path, const std::function<bool(const v1::StatusResponse&)>& ready = {},
    std::chrono::milliseconds timeout = std::chrono::seconds(20));

// A client on the admin socket of the daemon serving `socket_dir` (weightcached's default
// --admin_socket_dir, <socket_dir>-admin): the operator, who may evict and define specs.
std::unique_ptr<client::Client> AdminClient(const std::string& socket_dir);

// Runs the keeper (`keeper_path`) on `socket` with stderr in `log_path` and waits (10 s at
// most) until it accepts there; a test failure carrying its log otherwise.
std::unique_ptr<Process> StartKeeper(const std::string& keeper_path, const std::string& socket,
                                     const std::string& log_path);

// Polls `c`'s Status until `pred` holds (bounded by `timeout`); the last status either way,
// with a test failure added when the condition was not reached.
v1::StatusResponse WaitForStatus(client::Client& c,
                                 const std::function<bool(const v1::StatusResponse&)>& pred,
                                 std::chrono::milliseconds timeout);

// A tool (weightcachectl, ...) run to its end: exit code (-1 when signalled) and its stdout
// followed by its stderr (kept in `err_path`).
struct ToolRun {
  int rc = -1;
  std::string out;
};
ToolRun RunTool(const std::vector<std::string>& argv, const std::string& err_path);

// The whole file, or "" when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

// Polls the file (a daemon's log) until it holds `line`, bounded by `timeout` (a limit for
// the failure case, not a measure of speed). True when found.
bool WaitForLogLine(const std::string& path, const std::string& line,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The daemon's metrics port, from the log line of a daemon started with
// --metrics_address=127.0.0.1:0; -1 when not (yet) logged.
int MetricsPort(const std::string& log_path);
// One GET /metrics on 127.0.0.1:`port`: the whole HTTP answer, "" when it cannot connect.
std::string Scrape(int port);

// The bytes of tensor `name` as the checkpoint in `dir` stores them; "" when it cannot be read.
std::string CheckpointTensorBytes(const std::string& dir, const std::string& name);

// A small Llama (2 layers, hidden 256, 4 heads, 2 kv heads, vocab 1024): fast to write and
// load, real tensor names, divisible for tp 2.
safetensors::LlamaShape SmallLlama();

}  // namespace weightcache::testing
