#include "pkg/peer/internal/ucx_wire.h"

#include "absl/strings/str_cat.h"

namespace weightcache::peer {

absl::Status UcxError(const char* call, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat("UCX ", call, ": ", ucs_status_string(s)));
}

absl::StatusOr<ucp_context_h> MakeContext(uint64_t features, bool shared) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("ucp_config_read", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = features;
  params.mt_workers_shared = shared ? 1 : 0;
  ucp_context_h ctx = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);
  return ctx;
}

absl::StatusOr<ucp_worker_h> MakeWorker(ucp_context_h ctx, ucs_thread_mode_t mode) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = mode;
  ucp_worker_h w = nullptr;
  if (ucs_status_t s = ucp_worker_create(ctx, &params, &w); s != UCS_OK) {
    return UcxError("ucp_worker_create", s);
  }
  return w;
}

absl::Status SetHandler(ucp_worker_h w, uint16_t id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(w, &p); s != UCS_OK) {
    return UcxError("ucp_worker_set_am_recv_handler", s);
  }
  return absl::OkStatus();
}

}  // namespace weightcache::peer
