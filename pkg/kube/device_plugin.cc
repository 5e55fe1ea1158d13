#include "pkg/kube/device_plugin.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::kube {
namespace {

constexpr char kDeviceIdPrefix[] = "weightcache-";
constexpr int kMaxSlots = 100000;
// sockaddr_un::sun_path holds 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = sizeof(sockaddr_un::sun_path) - 1;

// The one place where absl::Status becomes grpc::Status (both use the canonical codes).
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      context + ": " + s.error_message());
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string StripTrailingSlash(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

bool IsAbsolute(const std::string& path) { return !path.empty() && path[0] == '/'; }

}  // namespace

// The DevicePlugin gRPC service of one server instance. Handlers run on gRPC's threads; they
// read the plugin's shared state under its mutex and never touch its control state.
class DevicePluginService final : public ::v1beta1::DevicePlugin::Service {
 public:
  DevicePluginService(DevicePlugin* plugin, uint64_t epoch) : plugin_(plugin), epoch_(epoch) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const ::v1beta1::Empty*,
                                      ::v1beta1::DevicePluginOptions* resp) override {
    resp->set_pre_start_required(false);
    resp->set_get_preferred_allocation_available(false);
    return grpc::Status::OK;
  }

  // Sends the device list at once, then again on every health change. Ends (OK) when the plugin
  // stops (after a last, all-Unhealthy list) or replaces this server; CANCELLED when the peer
  // goes away.
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const ::v1beta1::Empty*,
                            grpc::ServerWriter<::v1beta1::ListAndWatchResponse>* writer) override {
    const std::vector<std::string> ids = plugin_->DeviceIds();
    uint64_t seen = std::numeric_limits<uint64_t>::max();
    WC_LOG_INFO("device plugin: ListAndWatch opened (%s)", ctx->peer());
    while (true) {
      ::v1beta1::ListAndWatchResponse resp;
      bool send = false;
      bool last = false;
      {
        absl::MutexLock lock(&plugin_->mu_);
        auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(plugin_->mu_) {
          return plugin_->generation_ != seen || plugin_->stopping_ ||
                 plugin_->server_epoch_ != epoch_;
        };
        // The timeout only bounds how late a vanished peer is noticed; changes are signalled.
        if (!changed()) plugin_->cv_.WaitWithTimeout(&plugin_->mu_, absl::Seconds(1));
        if (plugin_->generation_ != seen) {
          seen = plugin_->generation_;
          const char* health = plugin_->healthy_ ? kHealthy : kUnhealthy;
          for (const std::string& id : ids) {
            ::v1beta1::Device* d = resp.add_devices();
            d->set_id(id);
            d->set_health(health);
          }
          send = true;
        }
        last = plugin_->stopping_ || plugin_->server_epoch_ != epoch_;
      }
      if (send && !writer->Write(resp)) {
        WC_LOG_INFO("device plugin: ListAndWatch peer went away");
        return grpc::Status::CANCELLED;
      }
      if (last) return grpc::Status::OK;
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    }
  }

  // Slots are interchangeable: must-include first, then the first available ones.
  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const ::v1beta1::PreferredAllocationRequest* req,
                                      ::v1beta1::PreferredAllocationResponse* resp) override {
    for (const auto& creq : req->container_requests()) {
      auto* cresp = resp->add_container_responses();
      for (const std::string& id : creq.must_include_deviceids()) {
        if (cresp->deviceids_size() >= creq.allocation_size()) break;
        cresp->add_deviceids(id);
      }
      for (const std::string& id : creq.available_deviceids()) {
        if (cresp->deviceids_size() >= creq.allocation_size()) break;
        bool taken = false;
        for (const std::string& have : cresp->deviceids()) taken = taken || have == id;
        if (!taken) cresp->add_deviceids(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const ::v1beta1::AllocateRequest* req,
                        ::v1beta1::AllocateResponse* resp) override {
    const DevicePlugin::Options& o = plugin_->options_;
    for (const auto& creq : req->container_requests()) {
      for (const std::string& id : creq.devices_ids()) {
        absl::Status s = CheckDeviceId(id);
        if (!s.ok()) return ToGrpc(s);
      }
      if (o.per_slot_dirs && creq.devices_ids_size() != 1) {
        return ToGrpc(absl::InvalidArgumentError(absl::StrCat(
            "Allocate: with per-slot socket directories (--namespace_rules) a container takes "
            "exactly one ",
            o.resource_name, ", got ", creq.devices_ids_size(), " (",
            absl::StrJoin(creq.devices_ids(), ", "), "); request ", o.resource_name, ": 1")));
      }
      auto* cresp = resp->add_container_responses();
      ::v1beta1::Mount* m = cresp->add_mounts();
      m->set_host_path(o.per_slot_dirs ? SlotSocketDir(o.host_socket_dir, creq.devices_ids(0))
                                       : o.host_socket_dir);
      m->set_container_path(o.container_socket_dir);
      // Read-only: connect(2) needs write permission on the socket inode, which a read-only
      // bind mount keeps; what it takes away is unlinking or replacing the daemon's sockets
      // (a root engine keeps CAP_DAC_OVERRIDE; tests/security proves both).
      m->set_read_only(true);
      (*cresp->mutable_envs())[kSocketEnv] = JoinPath(o.container_socket_dir, kControlSocketName);
    }
    WC_LOG_INFO("device plugin: Allocate for %d container(s): %s%s -> %s",
                req->container_requests_size(), o.host_socket_dir,
                o.per_slot_dirs ? "/slots/<id>" : "", o.container_socket_dir);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const ::v1beta1::PreStartContainerRequest*,
                                 ::v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  absl::Status CheckDeviceId(const std::string& id) const {
    int n = -1;
    if (absl::StartsWith(id, kDeviceIdPrefix) &&
        absl::SimpleAtoi(id.substr(sizeof(kDeviceIdPrefix) - 1), &n) && n >= 0 &&
        n < plugin_->options_.slots) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("Allocate: unknown device id \"", id,
                                                   "\" (this plugin has ", kDeviceIdPrefix, "0..",
                                                   plugin_->options_.slots - 1, ")"));
  }

  DevicePlugin* const plugin_;
  const uint64_t epoch_;
};

std::string DeviceId(int index) { return absl::StrCat(kDeviceIdPrefix, index); }

std::string SlotSocketDir(const std::string& socket_dir, const std::string& device_id) {
  return JoinPath(JoinPath(socket_dir, kSlotsDirName), device_id);
}

absl::StatusOr<std::unique_ptr<DevicePlugin>> DevicePlugin::Create(Options o) {
  auto bad = [](const std::string& msg) {
    return absl::InvalidArgumentError("device plugin: " + msg);
  };
  if (!IsAbsolute(o.kubelet_dir))
    return bad("kubelet_dir must be an absolute path: \"" + o.kubelet_dir + "\"");
  o.kubelet_dir = StripTrailingSlash(o.kubelet_dir);
  if (o.endpoint.empty() || o.endpoint.find('/') != std::string::npos ||
      o.endpoint == kKubeletSocketName) {
    return bad("endpoint must be a plain file name other than kubelet.sock: \"" + o.endpoint +
               "\"");
  }
  for (const std::string& p :
       {JoinPath(o.kubelet_dir, o.endpoint), JoinPath(o.kubelet_dir, kKubeletSocketName)}) {
    if (p.size() > kMaxSocketPath) {
      return bad(absl::StrCat("socket path ", p, " is ", p.size(), " bytes; Unix sockets allow ",
                              kMaxSocketPath));
    }
  }
  const size_t slash = o.resource_name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == o.resource_name.size() ||
      o.resource_name.find('/', slash + 1) != std::string::npos) {
    return bad("resource_name must be <domain>/<name>: \"" + o.resource_name + "\"");
  }
  if (o.slots < 1 || o.slots > kMaxSlots) {
    return bad(absl::StrCat("slots must be in [1, ", kMaxSlots, "]: ", o.slots));
  }
  if (!IsAbsolute(o.host_socket_dir)) {
    return bad("host_socket_dir must be an absolute path: \"" + o.host_socket_dir + "\"");
  }
  o.host_socket_dir = StripTrailingSlash(o.host_socket_dir);
  if (o.per_slot_dirs) {
    // The daemon listens there: the longest slot's socket must fit a Unix socket path.
    const std::string longest =
        JoinPath(SlotSocketDir(o.host_socket_dir, DeviceId(o.slots - 1)), kControlSocketName);
    if (longest.size() > kMaxSocketPath) {
      return bad(absl::StrCat("per-slot socket path ", longest, " is ", longest.size(),
                              " bytes; Unix sockets allow ", kMaxSocketPath,
                              " (a shorter host_socket_dir, or fewer slots)"));
    }
  }
  if (o.container_socket_dir.empty()) o.container_socket_dir = o.host_socket_dir;
  if (!IsAbsolute(o.container_socket_dir)) {
    return bad("container_socket_dir must be an absolute path: \"" + o.container_socket_dir + "\"");
  }
  o.container_socket_dir = StripTrailingSlash(o.container_socket_dir);
  if (o.poll_interval <= absl::ZeroDuration() || o.register_timeout <= absl::ZeroDuration()) {
    return bad("poll_interval and register_timeout must be positive");
  }
  return std::unique_ptr<DevicePlugin>(new DevicePlugin(std::move(o)));
}

DevicePlugin::DevicePlugin(Options options) : options_(std::move(options)) {}

DevicePlugin::~DevicePlugin() { Stop(); }

std::string DevicePlugin::endpoint_path() const {
  return JoinPath(options_.kubelet_dir, options_.endpoint);
}

std::string DevicePlugin::kubelet_socket_path() const {
  return JoinPath(options_.kubelet_dir, kKubeletSocketName);
}

std::vector<std::string> DevicePlugin::DeviceIds() const {
  std::vector<std::string> ids;
  ids.reserve(options_.slots);
  for (int i = 0; i < options_.slots; ++i) ids.push_back(DeviceId(i));
  return ids;
}

int64_t DevicePlugin::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

bool DevicePlugin::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

bool DevicePlugin::WaitForRegistrations(int64_t n, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (registrations_ < n) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return registrations_ >= n;
}

bool DevicePlugin::healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

DevicePlugin::FileId DevicePlugin::Stat(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return FileId{};
  return FileId{st.st_dev, st.st_ino,
                static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec, true};
}

absl::Status DevicePlugin::Start() {
  if (started_) return absl::FailedPreconditionError("device plugin: Start called twice");
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("device plugin: Start after Stop");
  }
  struct stat st;
  if (::stat(options_.kubelet_dir.c_str(), &st) != 0) {
    return Annotate(ErrnoStatus(errno, "stat", options_.kubelet_dir),
                    "device plugin: kubelet device-plugins dir");
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError("device plugin: " + options_.kubelet_dir +
                                      " is not a directory");
  }
  PollHealth();

  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoStatus(errno, "eventfd");
  wake_fd_.reset(efd);
  int ifd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (ifd < 0) {
    WC_LOG_WARN("device plugin: inotify_init1: %s; polling %s every %s instead",
                std::strerror(errno), options_.kubelet_dir,
                absl::FormatDuration(options_.poll_interval));
  } else {
    inotify_fd_.reset(ifd);
  }

  WC_RETURN_IF_ERROR(Serve());
  TryRegister(/*force=*/true);
  started_ = true;
  watcher_ = std::thread([this] { WatchLoop(); });
  return absl::OkStatus();
}

void DevicePlugin::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // Streams send this last list, all Unhealthy, and end.
    healthy_ = false;
    ++generation_;
    registered_ = false;
    cv_.SignalAll();
  }
  if (watcher_.joinable()) {
    uint64_t one = 1;
    if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
      WC_LOG_WARN("device plugin: waking the watcher: %s", std::strerror(errno));
    }
    watcher_.join();
  }
  StopServer();
  if (started_) WC_LOG_INFO("device plugin: stopped");
}

absl::Status DevicePlugin::Serve() {
  const std::string path = endpoint_path();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Annotate(ErrnoStatus(errno, "unlink", path), "device plugin: stale socket");
  }
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    epoch = ++server_epoch_;
    cv_.SignalAll();
  }
  auto service = std::make_unique<DevicePluginService>(this, epoch);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    return absl::UnavailableError("device plugin: cannot serve gRPC on unix:" + path);
  }
  service_ = std::move(service);
  server_ = std::move(server);
  our_socket_ = Stat(path);
  WC_LOG_INFO("device plugin: serving %s for %d x %s", path, options_.slots,
              options_.resource_name);
  return absl::OkStatus();
}

void DevicePlugin::StopServer() {
  if (!server_) return;
  {
    absl::MutexLock lock(&mu_);
    ++server_epoch_;  // open streams of this server end
    registered_ = false;
    cv_.SignalAll();
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
  service_.reset();
  const std::string path = endpoint_path();
  // Remove the socket only if it is still the one we made.
  if (our_socket_.exists && Stat(path) == our_socket_) ::unlink(path.c_str());
  our_socket_ = FileId{};
}

absl::Status DevicePlugin::Register() {
  const std::string kubelet = kubelet_socket_path();
  std::unique_ptr<::v1beta1::Registration::Stub> stub = ::v1beta1::Registration::NewStub(
      grpc::CreateChannel("unix:" + kubelet, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.register_timeout));
  ::v1beta1::RegisterRequest req;
  req.set_version(kDevicePluginApiVersion);
  req.set_endpoint(options_.endpoint);
  req.set_resource_name(options_.resource_name);
  req.mutable_options()->set_pre_start_required(false);
  req.mutable_options()->set_get_preferred_allocation_available(false);
  ::v1beta1::Empty resp;
  return FromGrpc(stub->Register(&ctx, req, &resp), "Register on " + kubelet);
}

void DevicePlugin::TryRegister(bool force) {
  const FileId kubelet = Stat(kubelet_socket_path());
  if (!kubelet.exists) {
    bool was;
    {
      absl::MutexLock lock(&mu_);
      was = registered_;
      registered_ = false;
    }
    const std::string msg = "waiting for " + kubelet_socket_path();
    if (was || last_register_error_ != msg) WC_LOG_INFO("device plugin: %s", msg);
    last_register_error_ = msg;
    return;
  }
  if (!force && kubelet == registered_kubelet_ && registered()) return;
  absl::Status s = Register();
  if (!s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      registered_ = false;
    }
    const std::string msg(s.message());
    if (msg != last_register_error_) WC_LOG_WARN("device plugin: %s (will retry)", msg);
    last_register_error_ = msg;
    return;
  }
  registered_kubelet_ = kubelet;
  last_register_error_.clear();
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    registered_ = true;
    n = ++registrations_;
    cv_.SignalAll();
  }
  WC_LOG_INFO("device plugin: registered %s (endpoint %s, registration #%d)",
              options_.resource_name, options_.endpoint, n);
}

bool DevicePlugin::PollHealth() {
  const bool h = options_.healthy ? options_.healthy() : true;
  absl::MutexLock lock(&mu_);
  if (stopping_ || h == healthy_) return false;
  healthy_ = h;
  ++generation_;
  cv_.SignalAll();
  WC_LOG_INFO("device plugin: devices now %s", h ? kHealthy : kUnhealthy);
  return true;
}

void DevicePlugin::WatchLoop() {
  const int timeout_ms =
      static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.poll_interval)));
  alignas(struct inotify_event) std::array<char, 4096> buf;
  while (true) {
    if (inotify_fd_ && watch_wd_ < 0) {
      watch_wd_ = ::inotify_add_watch(
          inotify_fd_.get(), options_.kubelet_dir.c_str(),
          IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF);
    }
    std::array<pollfd, 2> fds{pollfd{wake_fd_.get(), POLLIN, 0},
                              pollfd{inotify_fd_ ? inotify_fd_.get() : -1, POLLIN, 0}};
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      WC_LOG_ERROR("device plugin: poll: %s", std::strerror(errno));
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    bool kubelet_created = false;
    if (inotify_fd_) {
      while (true) {
        ssize_t n = ::read(inotify_fd_.get(), buf.data(), buf.size());
        if (n <= 0) break;
        for (ssize_t off = 0; off < n;) {
          const auto* ev = reinterpret_cast<const struct inotify_event*>(buf.data() + off);
          if ((ev->mask & (IN_CREATE | IN_MOVED_TO)) && ev->len > 0 &&
              std::strcmp(ev->name, kKubeletSocketName) == 0) {
            kubelet_created = true;
          }
          if (ev->mask & IN_IGNORED) watch_wd_ = -1;  // the dir went away: watch again
          off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
        }
      }
    }

    PollHealth();

    bool force = kubelet_created;
    if (!server_ || Stat(endpoint_path()) != our_socket_) {
      if (server_) WC_LOG_INFO("device plugin: %s vanished; serving it again", endpoint_path());
      StopServer();
      absl::Status s = Serve();
      if (!s.ok()) {
        WC_LOG_WARN("%s (will retry)", std::string(s.message()));
        continue;
      }
      force = true;
    }
    TryRegister(force);
  }
}

}  // namespace weightcache::kube
