// The C ABI (include/weightcache/weightcache.h) over client::Client and client::Lease. No
// C++ exception or type crosses it: every call converts an absl::Status into a wc_status and
// a malloc'd message.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/client/client.h"
#include "weightcache/v1/weightcache.pb.h"
#include "weightcache/weightcache.h"

#ifndef WEIGHTCACHE_VERSION
#define WEIGHTCACHE_VERSION "0.0.0"
#endif

struct wc_client {
  std::unique_ptr<weightcache::client::Client> client;
};

struct wc_artifact {
  std::unique_ptr<weightcache::client::Artifact> artifact;
};

struct wc_publish {
  std::unique_ptr<weightcache::client::Publish> publish;
};

struct wc_lease {
  std::unique_ptr<weightcache::client::Lease> lease;
  std::vector<std::string> dtype_names;  // per tensor, for wc_tensor::dtype
  // wc_lease_columns' arrays, built once at acquire.
  std::vector<const char*> names, dtypes;
  std::vector<int32_t> ndim;
  std::vector<int64_t> dims, strides;
  std::vector<uint32_t> segment;
  std::vector<uint64_t> offset, nbytes;
};

namespace {

namespace client = weightcache::client;

wc_status Fail(absl::StatusCode code, const std::string& message, char** error) {
  if (error != nullptr) {
    auto* s = static_cast<char*>(std::malloc(message.size() + 1));
    if (s != nullptr) {
      std::memcpy(s, message.c_str(), message.size() + 1);
      *error = s;
    }
  }
  return static_cast<wc_status>(code);
}

wc_status Return(const absl::Status& s, char** error) {
  if (s.ok()) return WC_OK;
  return Fail(s.code(), std::string(s.message()), error);
}

std::string Str(const char* s) { return s != nullptr ? s : ""; }

void Fill(const wc_lease& l, size_t i, wc_tensor* out) {
  const client::TensorView& v = l.lease->tensors()[i];
  out->name = v.name.c_str();
  out->dtype = l.dtype_names[i].c_str();
  out->ndim = static_cast<int32_t>(v.shape.size());
  out->shape = v.shape.data();
  out->strides = v.strides.data();
  out->data = v.data;
  out->nbytes = v.nbytes;
  out->segment = v.segment;
  out->offset = v.offset;
  out->backend = l.lease->backend().c_str();
  out->device_uuid = l.lease->device_uuid().c_str();
}

// INVALID_ARGUMENT naming the call when the key is missing or from another ABI.
absl::StatusOr<weightcache::v1::ArtifactKey> KeyOf(const wc_artifact_key* k, const char* call) {
  if (k == nullptr || k->struct_size != sizeof(wc_artifact_key)) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": key is NULL or not initialised with wc_artifact_key_init"));
  }
  weightcache::v1::ArtifactKey out;
  out.set_kind(Str(k->kind));
  out.set_model(Str(k->model));
  out.set_fingerprint(Str(k->fingerprint));
  out.set_engine(Str(k->engine));
  out.set_engine_version(Str(k->engine_version));
  out.set_torch_version(Str(k->torch_version));
  out.set_triton_version(Str(k->triton_version));
  out.set_cuda_version(Str(k->cuda_version));
  out.set_compute_capability(Str(k->compute_capability));
  out.set_settings_hash(Str(k->settings_hash));
  return out;
}

}  // namespace

extern "C" {

const char* wc_version(void) { return WEIGHTCACHE_VERSION; }
int wc_abi_version(void) { return WC_ABI_VERSION; }

const char* wc_status_name(wc_status status) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const auto i = static_cast<size_t>(status);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

void wc_string_free(char* s) { std::free(s); }

wc_status wc_connect(const char* socket, wc_client** out, char** error) {
  if (out == nullptr)
    return Fail(absl::StatusCode::kInvalidArgument, "wc_connect: out is NULL", error);
  *out = nullptr;
  auto c = client::Client::Connect(Str(socket));
  if (!c.ok()) return Return(c.status(), error);
  auto* h = new (std::nothrow) wc_client{std::move(*c)};
  if (h == nullptr)
    return Fail(absl::StatusCode::kResourceExhausted, "wc_connect: out of memory", error);
  *out = h;
  return WC_OK;
}

void wc_client_free(wc_client* client) { delete client; }

const char* wc_client_socket(const wc_client* client) {
  return client != nullptr ? client->client->socket_path().c_str() : "";
}

void wc_acquire_options_init(wc_acquire_options* o) {
  if (o == nullptr) return;
  *o = wc_acquire_options{};
  o->struct_size = sizeof(wc_acquire_options);
  o->tp_size = 1;
  o->pp_size = 1;
  o->timeout_ms = 600000;
}

wc_status wc_acquire(wc_client* client, const wc_acquire_options* o, wc_lease** out, char** error) {
  if (client == nullptr || o == nullptr || out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_acquire: client, options and out are required", error);
  }
  *out = nullptr;
  if (o->struct_size != sizeof(wc_acquire_options)) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("wc_acquire: options.struct_size is ", o->struct_size, ", expected ",
                             sizeof(wc_acquire_options),
                             " (call wc_acquire_options_init; header and library must match)"),
                error);
  }
  if (o->tp_size < 1 || o->tp_rank < 0 || o->tp_rank >= o->tp_size || o->pp_size < 1 ||
      o->pp_rank < 0 || o->pp_rank >= o->pp_size) {
    return Fail(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("wc_acquire: layout tp ", o->tp_rank, "/", o->tp_size, ", pp ", o->pp_rank,
                     "/", o->pp_size, " is invalid (need size >= 1 and 0 <= rank < size)"),
        error);
  }
  if (o->timeout_ms <= 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("wc_acquire: timeout_ms ", o->timeout_ms, " must be positive"), error);
  }
  client::AcquireOptions a;
  a.model = Str(o->model);
  a.fingerprint = Str(o->fingerprint);
  if (a.model.empty() && a.fingerprint.empty()) {  // the pod's annotations, through the env
    auto env = client::AcquireOptions::FromEnvironment();
    if (!env.ok()) return Return(env.status(), error);
    a.model = env->model;
    a.fingerprint = env->fingerprint;
  }
  a.tp_size = o->tp_size;
  a.tp_rank = o->tp_rank;
  a.pp_size = o->pp_size;
  a.pp_rank = o->pp_rank;
  a.compute_capability = Str(o->compute_capability);
  a.device_uuid = Str(o->device_uuid);
  a.dtype = Str(o->dtype);
  a.quantization = Str(o->quantization);
  a.wait_ready = o->wait_ready != 0;
  a.load_on_miss = o->load_on_miss != 0;
  a.timeout = std::chrono::milliseconds(o->timeout_ms);
  a.published = {Str(o->engine), Str(o->engine_version), Str(o->framework_version), Str(o->recipe)};
  auto lease = client->client->Acquire(a);
  if (!lease.ok()) return Return(lease.status(), error);
  auto h = std::make_unique<wc_lease>();
  h->dtype_names.reserve((*lease)->tensors().size());
  for (const auto& t : (*lease)->tensors()) {
    h->dtype_names.emplace_back(weightcache::safetensors::DTypeName(t.dtype));
  }
  h->lease = std::move(*lease);
  const auto& views = h->lease->tensors();
  for (size_t i = 0; i < views.size(); ++i) {
    const client::TensorView& v = views[i];
    h->names.push_back(v.name.c_str());
    h->dtypes.push_back(h->dtype_names[i].c_str());
    h->ndim.push_back(static_cast<int32_t>(v.shape.size()));
    h->dims.insert(h->dims.end(), v.shape.begin(), v.shape.end());
    h->strides.insert(h->strides.end(), v.strides.begin(), v.strides.end());
    h->segment.push_back(v.segment);
    h->offset.push_back(v.offset);
    h->nbytes.push_back(v.nbytes);
  }
  *out = h.release();
  return WC_OK;
}

void wc_lease_close(wc_lease* lease) { delete lease; }

wc_status wc_lease_info_get(const wc_lease* lease, wc_lease_info* info) {
  if (lease == nullptr || info == nullptr) return WC_INVALID_ARGUMENT;
  const client::Lease& l = *lease->lease;
  info->id = l.id().c_str();
  info->model = l.model().c_str();
  info->fingerprint = l.fingerprint().c_str();
  info->backend = l.backend().c_str();
  info->device_uuid = l.device_uuid().c_str();
  info->model_dir = l.model_dir().c_str();
  info->spec_yaml = l.spec_yaml().c_str();
  info->tp_size = l.tp_size();
  info->tp_rank = l.tp_rank();
  info->pp_size = l.pp_size();
  info->pp_rank = l.pp_rank();
  info->total_bytes = l.total_bytes();
  info->segment_count = l.segment_count();
  info->tensor_count = l.tensors().size();
  info->map_seconds = l.map_seconds();
  return WC_OK;
}

wc_status wc_lease_segment(const wc_lease* lease, uint64_t index, const void** base, uint64_t* size,
                           char** error) {
  if (lease == nullptr || base == nullptr || size == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_lease_segment: NULL argument", error);
  }
  if (index >= lease->lease->segment_count()) {
    return Fail(absl::StatusCode::kOutOfRange,
                absl::StrCat("wc_lease_segment: index ", index, " past the lease's ",
                             lease->lease->segment_count(), " segments"),
                error);
  }
  *base = lease->lease->segment_base(index);
  *size = lease->lease->segment_size(index);
  return WC_OK;
}

wc_status wc_lease_tensor(const wc_lease* lease, uint64_t index, wc_tensor* out, char** error) {
  if (lease == nullptr || out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_lease_tensor: NULL argument", error);
  }
  if (index >= lease->lease->tensors().size()) {
    return Fail(absl::StatusCode::kOutOfRange,
                absl::StrCat("wc_lease_tensor: index ", index, " past the lease's ",
                             lease->lease->tensors().size(), " tensors"),
                error);
  }
  Fill(*lease, index, out);
  return WC_OK;
}

wc_status wc_lease_tensors(const wc_lease* lease, wc_tensor* out, uint64_t count,
                           uint64_t* filled) {
  if (lease == nullptr || (out == nullptr && count > 0)) return WC_INVALID_ARGUMENT;
  const uint64_t n = std::min<uint64_t>(count, lease->lease->tensors().size());
  for (uint64_t i = 0; i < n; ++i) Fill(*lease, i, &out[i]);
  if (filled != nullptr) *filled = n;
  return WC_OK;
}

wc_status wc_lease_columns(const wc_lease* lease, wc_tensor_columns* out) {
  if (lease == nullptr || out == nullptr) return WC_INVALID_ARGUMENT;
  *out = wc_tensor_columns{lease->names.size(),   lease->names.data(),  lease->dtypes.data(),
                           lease->ndim.data(),    lease->dims.data(),   lease->strides.data(),
                           lease->segment.data(), lease->offset.data(), lease->nbytes.data()};
  return WC_OK;
}

wc_status wc_lease_find(const wc_lease* lease, const char* name, wc_tensor* out, char** error) {
  if (lease == nullptr || name == nullptr || out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_lease_find: NULL argument", error);
  }
  const client::TensorView* v = lease->lease->Find(name);
  if (v == nullptr) {
    return Fail(
        absl::StatusCode::kNotFound,
        absl::StrCat("lease of model '", lease->lease->model(), "' has no tensor '", name, "'"),
        error);
  }
  Fill(*lease, static_cast<size_t>(v - lease->lease->tensors().data()), out);
  return WC_OK;
}

wc_status wc_lease_check(const wc_lease* lease, int timeout_ms, char** error) {
  if (lease == nullptr || timeout_ms < 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_lease_check: NULL lease or negative timeout_ms", error);
  }
  return Return(lease->lease->Check(std::chrono::milliseconds(timeout_ms)), error);
}

wc_status wc_lease_watch(const wc_lease* lease, int timeout_ms, wc_lease_state* state,
                         char** message) {
  if (lease == nullptr || state == nullptr || timeout_ms < 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_lease_watch: NULL lease or state, or negative timeout_ms", message);
  }
  const client::LeaseWatch w = lease->lease->Watch(std::chrono::milliseconds(timeout_ms));
  switch (w.state) {
    case client::LeaseState::kClean:
      *state = WC_LEASE_CLEAN;
      break;
    case client::LeaseState::kCorrupt:
      *state = WC_LEASE_CORRUPT;
      break;
    case client::LeaseState::kUnknown:
      *state = WC_LEASE_UNKNOWN;
      break;
  }
  if (message != nullptr) *message = nullptr;
  if (!w.message.empty()) Fail(absl::StatusCode::kOk, w.message, message);
  return WC_OK;
}

wc_status wc_lease_detach(wc_lease* lease, char** error) {
  if (lease == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_lease_detach: lease is NULL", error);
  }
  return Return(lease->lease->Detach(), error);
}

wc_status wc_lease_reattach(wc_lease* lease, int32_t load_on_miss, int64_t timeout_ms,
                            char** error) {
  if (lease == nullptr || timeout_ms <= 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("wc_lease_reattach: ",
                             lease == nullptr
                                 ? "lease is NULL"
                                 : absl::StrCat("timeout_ms ", timeout_ms, " must be positive")),
                error);
  }
  client::Lease::ReattachOptions o;
  o.load_on_miss = load_on_miss != 0;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return Return(lease->lease->Reattach(o), error);
}

int wc_lease_detached(const wc_lease* lease) {
  return lease != nullptr && lease->lease->detached() ? 1 : 0;
}

wc_status wc_release(wc_client* client, const char* lease_id, char** error) {
  if (client == nullptr || lease_id == nullptr || *lease_id == '\0') {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_release: client and lease_id are required",
                error);
  }
  return Return(client->client->Release(lease_id), error);
}

wc_status wc_status_json(wc_client* client, char** json, char** error) {
  if (client == nullptr || json == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_status_json: NULL argument", error);
  }
  auto st = client->client->Status();
  if (!st.ok()) return Return(st.status(), error);
  std::string text;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  auto s = google::protobuf::util::MessageToJsonString(*st, &text, opts);
  if (!s.ok()) {
    return Fail(absl::StatusCode::kInternal,
                absl::StrCat("wc_status_json: ", std::string(s.message())), error);
  }
  *json = static_cast<char*>(std::malloc(text.size() + 1));
  if (*json == nullptr) {
    return Fail(absl::StatusCode::kResourceExhausted, "wc_status_json: out of memory", error);
  }
  std::memcpy(*json, text.c_str(), text.size() + 1);
  return WC_OK;
}

wc_status wc_load(wc_client* client, const char* model, const char* spec_yaml,
                  wc_progress_fn on_progress, void* user_data, char** error) {
  if (client == nullptr || (Str(model).empty() && Str(spec_yaml).empty())) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_load: a client and a model name or spec_yaml are required", error);
  }
  auto cb = [&](const weightcache::v1::LoadProgress& p) {
    if (on_progress == nullptr) return;
    wc_load_progress w{p.fingerprint().c_str(), p.state().c_str(),        p.bytes_done(),
                       p.bytes_total(),         p.current_file().c_str(), p.error().c_str(),
                       p.elapsed_seconds()};
    on_progress(&w, user_data);
  };
  return Return(client->client->Load(Str(model), Str(spec_yaml), cb), error);
}

wc_status wc_evict(wc_client* client, const char* model, const char* fingerprint, uint32_t* evicted,
                   char** error) {
  if (client == nullptr || (Str(model).empty() && Str(fingerprint).empty())) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_evict: a client and a model name or fingerprint are required", error);
  }
  auto n = client->client->Evict(Str(model), Str(fingerprint));
  if (!n.ok()) return Return(n.status(), error);
  if (evicted != nullptr) *evicted = *n;
  return WC_OK;
}

void wc_publish_options_init(wc_publish_options* o) {
  if (o == nullptr) return;
  *o = wc_publish_options{};
  o->struct_size = sizeof(wc_publish_options);
  o->tp_size = 1;
  o->pp_size = 1;
  o->timeout_ms = 600000;
}

wc_status wc_publish_begin(wc_client* client, const wc_publish_options* o, wc_publish** out,
                           char** error) {
  if (client == nullptr || o == nullptr || out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_publish_begin: client, options and out are required", error);
  }
  *out = nullptr;
  if (o->struct_size != sizeof(wc_publish_options)) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("wc_publish_begin: options.struct_size is ", o->struct_size,
                             ", expected ", sizeof(wc_publish_options),
                             " (call wc_publish_options_init; header and library must match)"),
                error);
  }
  if (o->tensor_count > 0 && o->tensors == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_publish_begin: tensors is NULL but tensor_count is not 0", error);
  }
  client::PublishOptions p;
  p.model = Str(o->model);
  p.tp_size = o->tp_size;
  p.tp_rank = o->tp_rank;
  p.pp_size = o->pp_size;
  p.pp_rank = o->pp_rank;
  p.compute_capability = Str(o->compute_capability);
  p.device_uuid = Str(o->device_uuid);
  p.identity = {Str(o->engine), Str(o->engine_version), Str(o->framework_version), Str(o->recipe)};
  p.timeout = std::chrono::milliseconds(o->timeout_ms > 0 ? o->timeout_ms : 600000);
  for (uint64_t i = 0; i < o->tensor_count; ++i) {
    const wc_publish_tensor& t = o->tensors[i];
    auto dtype = weightcache::safetensors::ParseDType(Str(t.dtype));
    if (!dtype.ok()) {
      return Fail(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("wc_publish_begin: tensor '", Str(t.name), "': ", dtype.status().message()),
          error);
    }
    if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
      return Fail(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("wc_publish_begin: tensor '", Str(t.name), "': ndim ", t.ndim,
                               " with ", t.shape == nullptr ? "no" : "a", " shape"),
                  error);
    }
    p.tensors.push_back(
        {Str(t.name), *dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim), t.nbytes});
  }
  auto begun = client->client->BeginPublish(p);
  if (!begun.ok()) return Return(begun.status(), error);
  auto* h = new (std::nothrow) wc_publish{std::move(*begun)};
  if (h == nullptr) {
    return Fail(absl::StatusCode::kResourceExhausted, "wc_publish_begin: out of memory", error);
  }
  *out = h;
  return WC_OK;
}

int wc_publish_joined(const wc_publish* publish) {
  return publish != nullptr && publish->publish->joined() ? 1 : 0;
}

const char* wc_publish_fingerprint(const wc_publish* publish) {
  return publish != nullptr ? publish->publish->fingerprint().c_str() : "";
}

wc_status wc_publish_data(const wc_publish* publish, const char* name, void** data,
                          uint64_t* nbytes, char** error) {
  if (publish == nullptr || name == nullptr || data == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_publish_data: publish, name and data are required", error);
  }
  const client::TensorView* v = publish->publish->Find(name);
  void* p = v != nullptr ? publish->publish->Data(*v) : nullptr;
  if (p == nullptr) {
    return Fail(absl::StatusCode::kNotFound,
                absl::StrCat("wc_publish_data: tensor '", name,
                             "' is not writable in this publish (not begun, joined or ended)"),
                error);
  }
  *data = p;
  if (nbytes != nullptr) *nbytes = v->nbytes;
  return WC_OK;
}

wc_status wc_publish_commit(wc_publish* publish, char** error) {
  if (publish == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "wc_publish_commit: publish is NULL", error);
  }
  return Return(publish->publish->Commit(), error);
}

void wc_publish_free(wc_publish* publish) { delete publish; }

void wc_artifact_key_init(wc_artifact_key* key) {
  if (key == nullptr) return;
  *key = wc_artifact_key{};
  key->struct_size = sizeof(wc_artifact_key);
}

wc_status wc_artifact_put(wc_client* client, const wc_artifact_key* key, const void* data,
                          uint64_t size, char** error) {
  if (client == nullptr || (data == nullptr && size > 0)) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_artifact_put: a client and the data are required", error);
  }
  auto k = KeyOf(key, "wc_artifact_put");
  if (!k.ok()) return Return(k.status(), error);
  auto r = client->client->PutArtifact(
      *k, std::string_view(static_cast<const char*>(data), static_cast<size_t>(size)));
  return Return(r.status(), error);
}

wc_status wc_artifact_get(wc_client* client, const wc_artifact_key* key, int64_t wait_ms,
                          wc_artifact** out, char** error) {
  if (client == nullptr || out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument,
                "wc_artifact_get: a client and out are required", error);
  }
  *out = nullptr;
  auto k = KeyOf(key, "wc_artifact_get");
  if (!k.ok()) return Return(k.status(), error);
  auto a =
      client->client->GetArtifact(*k, std::chrono::milliseconds(std::max<int64_t>(0, wait_ms)));
  if (!a.ok()) return Return(a.status(), error);
  *out = new (std::nothrow) wc_artifact{std::move(*a)};
  if (*out == nullptr) return Fail(absl::StatusCode::kResourceExhausted, "out of memory", error);
  return WC_OK;
}

const void* wc_artifact_data(const wc_artifact* a) {
  return a != nullptr ? a->artifact->data() : nullptr;
}
uint64_t wc_artifact_size(const wc_artifact* a) { return a != nullptr ? a->artifact->size() : 0; }
const char* wc_artifact_id(const wc_artifact* a) {
  return a != nullptr ? a->artifact->id().c_str() : "";
}
void wc_artifact_free(wc_artifact* a) { delete a; }

}  // extern "C"
