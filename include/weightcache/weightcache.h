/* weightcache C ABI: map a model-rank that the node daemon (weightcached) keeps resident, as
 * read-only, zero-copy tensors, from any language with a C FFI. Shaped like sqlite3.h:
 * opaque handles with create/destroy pairs, a status code from every call, and a message
 * the caller frees with wc_string_free().
 *
 *   wc_client* c = NULL;
 *   char* err = NULL;
 *   if (wc_connect(NULL, &c, &err) != WC_OK) { fprintf(stderr, "%s\n", err); wc_string_free(err); }
 *   wc_acquire_options o;
 *   wc_acquire_options_init(&o);
 *   o.model = "llama-8b";
 *   wc_lease* lease = NULL;
 *   if (wc_acquire(c, &o, &lease, &err) == WC_OK) {
 *     wc_tensor t;
 *     wc_lease_find(lease, "model.embed_tokens.weight", &t, NULL);  // t.data: read-only
 *     wc_lease_close(lease);  // unmaps; the daemon ends the lease at once
 *   }
 *   wc_client_free(c);
 *
 * Errors: every function returning wc_status returns WC_OK or a code from the list below
 * (gRPC/absl canonical codes: WC_NOT_FOUND is a cache miss, WC_FAILED_PRECONDITION a
 * fingerprint mismatch whose message lists every differing field as "field: cached X, asked
 * Y; ..." or, with the prefix "stale:", weights whose files changed on disk after loading,
 * WC_UNIMPLEMENTED a quantization the cache refuses, WC_UNAVAILABLE a daemon that does not
 * answer). When `error` is not NULL and the call fails, *error receives a NUL-terminated
 * message (malloc'd; free it with wc_string_free); on success *error is left untouched.
 *
 * Lifetimes: a wc_lease owns its mappings. Every pointer read from it (wc_lease_info's
 * strings, wc_tensor's name/shape/strides/data) stays valid until wc_lease_close(lease), and
 * no longer. A lease does not depend on its client: wc_client_free() may come first, and the
 * mapped memory stays readable if the daemon dies. The memory is READ-ONLY: a write through
 * `data` is SIGSEGV on the host backend and an illegal-address error on cuda-vmm. For
 * cuda-vmm leases `data` is a device pointer on the GPU named by device_uuid, mapped in this
 * process's primary context.
 *
 * Threads: a wc_client may be used from several threads at once. A wc_lease is immutable
 * after wc_acquire (but for wc_lease_detach/wc_lease_reattach, called while no other thread
 * uses it) and may be read from any thread; close it once, when no thread uses it.
 *
 * Symbols: libweightcache.so exports only wc_-prefixed symbols. Its gRPC, protobuf and
 * abseil are the system's shared libraries; processes that carry other copies of them
 * (torch, grpcio) should load it with RTLD_LOCAL | RTLD_DEEPBIND, as the Python package does
 * (docs/engines.md says why).
 */
#ifndef WEIGHTCACHE_WEIGHTCACHE_H_
#define WEIGHTCACHE_WEIGHTCACHE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. wc_abi_version() returns the library's; they must be equal
 * for the structs below to match. */
#define WC_ABI_VERSION 3

#if defined(__GNUC__)
#define WC_API __attribute__((visibility("default")))
#else
#define WC_API
#endif

typedef enum wc_status {
  WC_OK = 0,
  WC_CANCELLED = 1,
  WC_UNKNOWN = 2,
  WC_INVALID_ARGUMENT = 3,
  WC_DEADLINE_EXCEEDED = 4,
  WC_NOT_FOUND = 5,
  WC_ALREADY_EXISTS = 6,
  WC_PERMISSION_DENIED = 7,
  WC_RESOURCE_EXHAUSTED = 8,
  WC_FAILED_PRECONDITION = 9,
  WC_ABORTED = 10,
  WC_OUT_OF_RANGE = 11,
  WC_UNIMPLEMENTED = 12,
  WC_INTERNAL = 13,
  WC_UNAVAILABLE = 14,
  WC_DATA_LOSS = 15,
  WC_UNAUTHENTICATED = 16
} wc_status;

typedef struct wc_client wc_client;
typedef struct wc_lease wc_lease;

/* The library's version ("0.1.0") and ABI version (WC_ABI_VERSION it was built with). */
WC_API const char* wc_version(void);
WC_API int wc_abi_version(void);
/* The code's name, e.g. "NOT_FOUND"; a static string. */
WC_API const char* wc_status_name(wc_status status);
/* Frees a message or JSON text that this library returned. NULL is a no-op. */
WC_API void wc_string_free(char* s);

/* Connects to the daemon's control socket: `socket` is control.sock's path or the directory
 * holding it; NULL or "" means $WEIGHTCACHE_SOCKET, else /run/weightcache/control.sock.
 * WC_UNAVAILABLE when no socket is there. The daemon is not contacted until the first call
 * that needs it. On success *out owns a client; free it with wc_client_free. */
WC_API wc_status wc_connect(const char* socket, wc_client** out, char** error);
WC_API void wc_client_free(wc_client* client);
/* The control socket path the client resolved; valid while the client lives. */
WC_API const char* wc_client_socket(const wc_client* client);

/* What to acquire. Initialise with wc_acquire_options_init (it sets struct_size and the
 * defaults), then set fields. Strings are read during wc_acquire only; NULL means "". */
typedef struct wc_acquire_options {
  uint32_t struct_size; /* sizeof(wc_acquire_options), set by wc_acquire_options_init */
  /* Both NULL or "": $WEIGHTCACHE_FINGERPRINT when set, else $WEIGHTCACHE_MODEL (the pod
   * annotations through the Downward API); WC_INVALID_ARGUMENT naming them when neither is. */
  const char* model;       /* spec name; or */
  const char* fingerprint; /* an exact fingerprint (hex SHA-256) */
  int32_t tp_size;         /* default 1 */
  int32_t tp_rank;
  int32_t pp_size; /* default 1 */
  int32_t pp_rank;
  const char* compute_capability; /* "" = the daemon's environment */
  const char* device_uuid;        /* GPU the caller will use ("GPU-..."); "" for host */
  const char* dtype;              /* optional expectation: "bf16", "fp16", "fp32" */
  const char* quantization;       /* optional expectation: "none" | "fp8_block" */
  int32_t wait_ready;             /* nonzero: wait for a load in progress */
  int32_t load_on_miss;           /* nonzero: ask the daemon to load a known model on a miss */
  int64_t timeout_ms;             /* default 600000 */
  /* Weights an engine published (wc_publish_begin): the same identity maps them. "" / NULL
   * for weights the daemon loaded. (ABI 2) */
  const char* engine;
  const char* engine_version;
  const char* framework_version;
  const char* recipe;
} wc_acquire_options;

WC_API void wc_acquire_options_init(wc_acquire_options* options);

/* Acquires and maps a model-rank read-only. On success *out owns the lease; close it with
 * wc_lease_close. The client may be freed before the lease. */
WC_API wc_status wc_acquire(wc_client* client, const wc_acquire_options* options, wc_lease** out,
                            char** error);
/* Unmaps every segment, then ends the lease in the daemon (closes its handle connection).
 * Invalidates every pointer read from the lease. NULL is a no-op. */
WC_API void wc_lease_close(wc_lease* lease);

typedef struct wc_lease_info {
  const char* id;
  const char* model;
  const char* fingerprint;
  const char* backend;     /* "host" | "cuda-vmm" */
  const char* device_uuid; /* "" for host */
  const char* model_dir;   /* the checkpoint directory, as the daemon sees it */
  const char* spec_yaml;   /* the spec the entry was loaded from (canonical YAML) */
  int32_t tp_size, tp_rank, pp_size, pp_rank;
  uint64_t total_bytes;
  uint64_t segment_count;
  uint64_t tensor_count;
  double map_seconds; /* from sending Acquire to every segment mapped */
} wc_lease_info;

/* Fills *info; its strings live as long as the lease. Never fails for a valid lease. */
WC_API wc_status wc_lease_info_get(const wc_lease* lease, wc_lease_info* info);

/* One segment's mapped base (host or device pointer) and size in bytes. */
WC_API wc_status wc_lease_segment(const wc_lease* lease, uint64_t index, const void** base,
                                  uint64_t* size, char** error);

typedef struct wc_tensor {
  const char* name;
  const char* dtype; /* safetensors dtype name: "BF16", "F32", "F8_E4M3", ... */
  int32_t ndim;
  const int64_t* shape;   /* ndim values */
  const int64_t* strides; /* ndim values, in elements */
  const void* data;       /* read-only; host pointer, or device pointer for cuda-vmm */
  uint64_t nbytes;
  uint32_t segment;        /* index of the segment holding it */
  uint64_t offset;         /* bytes from that segment's base */
  const char* backend;     /* the lease's: "host" | "cuda-vmm" */
  const char* device_uuid; /* the lease's: "" for host */
} wc_tensor;

/* Tensor `index` (0 <= index < tensor_count) in name order. WC_OUT_OF_RANGE past the end. */
WC_API wc_status wc_lease_tensor(const wc_lease* lease, uint64_t index, wc_tensor* out,
                                 char** error);
/* The whole table at once: fills out[0..min(count, tensor_count)) and sets *filled. */
WC_API wc_status wc_lease_tensors(const wc_lease* lease, wc_tensor* out, uint64_t count,
                                  uint64_t* filled);
/* The whole table as columns, for FFIs where a call or a struct per tensor is slow (Python):
 * each array holds `count` entries in table (name) order, except dims and strides, which
 * hold the shapes and strides of every tensor back to back (ndim[i] values each). Pointers
 * valid while the lease lives. */
typedef struct wc_tensor_columns {
  uint64_t count;
  const char* const* names;
  const char* const* dtypes;
  const int32_t* ndim;
  const int64_t* dims;
  const int64_t* strides;
  const uint32_t* segment;
  const uint64_t* offset;
  const uint64_t* nbytes;
} wc_tensor_columns;

WC_API wc_status wc_lease_columns(const wc_lease* lease, wc_tensor_columns* out);

/* The tensor named `name`; WC_NOT_FOUND naming it otherwise. */
WC_API wc_status wc_lease_find(const wc_lease* lease, const char* name, wc_tensor* out,
                               char** error);

/* What is known of the lease's memory (wc_lease_watch). */
typedef enum wc_lease_state {
  WC_LEASE_CLEAN = 0,   /* a daemon watches it for this lease and reported nothing */
  WC_LEASE_CORRUPT = 1, /* the daemon reported it changed after sealing: stop using it */
  WC_LEASE_UNKNOWN = 2  /* no daemon watches it for this process (gone, or another copy) */
} wc_lease_state;

/* Whether the lease's memory is still what the daemon sealed. The daemon scrubs resident
 * weights (docs/integrity.md); when it finds they changed after sealing (a process wrote
 * through a writable import, a stray kernel, a memory error) it stops serving them, loads a
 * clean copy for new acquires and tells every lease holder: WC_LEASE_CORRUPT, on this and
 * every later call. When the lease's handle connection closes (the daemon ended or restarted,
 * e.g. a rollout) the lease re-attaches, without mapping again, once a daemon is back that
 * serves this very memory (it adopted it from the keeper); that daemon counts the lease and
 * tells it of corruption again: WC_LEASE_CLEAN. Until then, and for good when the daemon
 * serves another copy, WC_LEASE_UNKNOWN: the memory stays mapped and readable but nobody
 * watches it for this process. A re-attach is tried at most once a second, bounded by about
 * 2 s. Sets *state, and *message (optional; NULL to skip) to the daemon's message (corrupt:
 * segment and bytes) or why it is unknown (malloc'd, free with wc_string_free; NULL when
 * clean). Returns WC_OK (WC_INVALID_ARGUMENT for a NULL lease or state, or a negative
 * timeout). Waits up to `timeout_ms` for news (0: only looks; one system call). Any thread.
 * (Added without changing any struct: WC_ABI_VERSION stays.) */
WC_API wc_status wc_lease_watch(const wc_lease* lease, int timeout_ms, wc_lease_state* state,
                                char** message);

/* wc_lease_watch as a status: WC_OK (clean), WC_DATA_LOSS (corrupt; *error names the segment
 * and bytes) or WC_UNAVAILABLE ("unknown: ..." and why). On WC_DATA_LOSS stop using the
 * weights: acquire again (the clean copy) or restart. Any thread. */
WC_API wc_status wc_lease_check(const wc_lease* lease, int timeout_ms, char** error);

/* ---- Sleep and wake: detach and re-attach (added without changing any struct: WC_ABI_VERSION
 * stays). docs/engines.md, "Sleep and wake". ----
 *
 * wc_lease_detach unmaps every segment and lets go of the memory (cuda-vmm: waits for the
 * context's queued work, cuMemUnmap, cuMemRelease of the imported handles), then ends the lease
 * in the daemon, which may then evict the entry and fill its memory with another model. The
 * address ranges stay reserved (host: PROT_NONE; cuda-vmm: the cuMemAddressReserve range), so
 * every tensor's `data` and segment base keeps its value and nothing else can appear there;
 * reading them while detached faults (SIGSEGV; an illegal address on the GPU). A detached lease
 * never re-attaches on its own (wc_lease_watch: WC_LEASE_UNKNOWN, "detached"). WC_OK when
 * detached already. Call it when no thread or kernel reads the lease's memory. */
WC_API wc_status wc_lease_detach(wc_lease* lease, char** error);
/* Maps the same fingerprint at the same addresses again: an acquire by the lease's fingerprint,
 * else (the entry was evicted or is stale) by its model name with the same layout and device,
 * loading it when `load_on_miss` is nonzero. WC_FAILED_PRECONDITION naming both fingerprints
 * when the daemon now serves another fingerprint for the model (the lease stays detached:
 * acquire the new weights as a new lease). On any failure the lease stays detached and this may
 * be called again. WC_FAILED_PRECONDITION when attached. The lease gets a new id: strings from
 * an earlier wc_lease_info_get are invalid after it (the tensor table's are not). timeout_ms > 0.
 */
WC_API wc_status wc_lease_reattach(wc_lease* lease, int32_t load_on_miss, int64_t timeout_ms,
                                   char** error);
/* 1 while detached, 0 while attached (or for NULL). */
WC_API int wc_lease_detached(const wc_lease* lease);

/* Ends a lease by id through the control API (the daemon's Release). Closing the wc_lease is
 * the usual way; this serves tools that end other processes' leases. */
WC_API wc_status wc_release(wc_client* client, const char* lease_id, char** error);

/* The daemon's Status as JSON (the StatusResponse message of proto/weightcache/v1, proto3
 * JSON mapping with the proto field names). Free *json with wc_string_free. */
WC_API wc_status wc_status_json(wc_client* client, char** json, char** error);

typedef struct wc_load_progress {
  const char* fingerprint;
  const char* state; /* loading | ready | failed */
  uint64_t bytes_done;
  uint64_t bytes_total;
  const char* current_file;
  const char* error;
  double elapsed_seconds;
} wc_load_progress;

/* Called on the thread that called wc_load, once per progress message; `progress` and its
 * strings are valid during the call only. */
typedef void (*wc_progress_fn)(const wc_load_progress* progress, void* user_data);

/* Loads a model the daemon knows (`model`) or an inline spec (`spec_yaml`, YAML or JSON);
 * one of them non-empty: every rank the spec lists (its tp_ranks). Blocks until the load
 * ends; `on_progress` may be NULL. */
WC_API wc_status wc_load(wc_client* client, const char* model, const char* spec_yaml,
                         wc_progress_fn on_progress, void* user_data, char** error);

/* Drops the daemon's reference to every entry of `model`, or to the entry `fingerprint`
 * (one of them non-empty); *evicted (may be NULL) receives the count. Memory that clients
 * map stays valid. */
WC_API wc_status wc_evict(wc_client* client, const char* model, const char* fingerprint,
                          uint32_t* evicted, char** error);

/* ---- Publishing (ABI 2): an engine donates weights it processed itself. ----
 *
 *   wc_publish_options o; wc_publish_options_init(&o);
 *   o.model = "llama-8b"; o.engine = "myengine"; o.recipe = "fp8-v1";
 *   o.tensors = list; o.tensor_count = n;
 *   wc_publish* p = NULL;
 *   if (wc_publish_begin(c, &o, &p, &err) == WC_OK) {
 *     if (!wc_publish_joined(p)) {
 *       for each tensor: wc_publish_data(p, name, &dst, &nbytes, NULL); copy into dst;
 *       wc_publish_commit(p, &err);
 *     }
 *     wc_publish_free(p);  // without a commit: aborts, nothing is left in the daemon
 *   }
 *   then wc_acquire with the same engine fields and recipe maps it read-only.
 */
typedef struct wc_publish wc_publish;

typedef struct wc_publish_tensor {
  const char* name;
  const char* dtype; /* safetensors name: "BF16", "F8_E4M3", "F32", ... */
  const int64_t* shape;
  int32_t ndim;
  uint64_t nbytes; /* product(shape) x dtype size */
} wc_publish_tensor;

/* Initialise with wc_publish_options_init. Strings and the tensor list are read during
 * wc_publish_begin only. */
typedef struct wc_publish_options {
  uint32_t struct_size; /* sizeof(wc_publish_options), set by wc_publish_options_init */
  const char* model;    /* the base checkpoint: a spec name the daemon knows */
  int32_t tp_size;      /* default 1 */
  int32_t tp_rank;
  int32_t pp_size; /* default 1 */
  int32_t pp_rank;
  const char* compute_capability; /* "" = the device's */
  const char* device_uuid;        /* GPU holding the source tensors; "" for host */
  const char* engine;             /* required */
  const char* engine_version;
  const char* framework_version; /* e.g. "torch 2.8.0" */
  const char* recipe;            /* required: the engine's name for its processing */
  const wc_publish_tensor* tensors;
  uint64_t tensor_count;
  int64_t timeout_ms; /* default 600000 */
} wc_publish_options;

WC_API void wc_publish_options_init(wc_publish_options* options);
/* Begins a publish: the daemon allocates the segments, this process maps them writable.
 * On success *out owns the publish; free it with wc_publish_free (which aborts it unless
 * committed). The client must outlive the publish. PERMISSION_DENIED when this uid may not
 * publish (the daemon's --publish_uids/--publish_gids). */
WC_API wc_status wc_publish_begin(wc_client* client, const wc_publish_options* options,
                                  wc_publish** out, char** error);
/* 1 when another publisher has (or already published) the same key: nothing to write or
 * commit; wc_acquire with wait_ready maps its weights. 0 otherwise. */
WC_API int wc_publish_joined(const wc_publish* publish);
/* The fingerprint the weights will be served under; valid while the publish lives. */
WC_API const char* wc_publish_fingerprint(const wc_publish* publish);
/* The writable address (host pointer, or device pointer on cuda-vmm) and size of tensor
 * `name`, valid until commit or free. NOT_FOUND naming it when it was not begun. */
WC_API wc_status wc_publish_data(const wc_publish* publish, const char* name, void** data,
                                 uint64_t* nbytes, char** error);
/* Waits for queued writes, unmaps the writable views and commits: the daemon seals the
 * segments and serves them. On WC_FAILED_PRECONDITION (a writable mapping of the memory
 * remains elsewhere: unmap it), WC_UNAVAILABLE or WC_DEADLINE_EXCEEDED the publish stays
 * open and may be committed again or freed; any other failure has ended it. */
WC_API wc_status wc_publish_commit(wc_publish* publish, char** error);
/* Aborts the publish unless committed, and frees it. NULL is a no-op. */
WC_API void wc_publish_free(wc_publish* publish);

/* ---- Compile artifacts (ABI 3): blobs an engine keeps beside the weights. ----
 *
 * A torch.compile cache, a Triton or JIT cache directory packed by the engine: put once by an
 * engine with the publish role, mapped read-only (zero-copy, a sealed memfd) by every later
 * engine of the model. The key names what makes the blob valid; every field is part of it.
 *
 *   wc_artifact_key k; wc_artifact_key_init(&k);
 *   k.kind = "torch-compile"; k.model = "llama-8b"; k.fingerprint = fp; k.torch_version = ...;
 *   wc_artifact* a = NULL;
 *   if (wc_artifact_get(c, &k, 0, &a, &err) == WC_OK) { use wc_artifact_data(a);
 * wc_artifact_free(a); } else if NOT_FOUND: compile, then wc_artifact_put(c, &k, bytes, size,
 * &err);
 */
typedef struct wc_artifact wc_artifact;

/* Initialise with wc_artifact_key_init; strings are read during the call only. kind, model
 * (a spec name the daemon knows) and fingerprint are required. */
typedef struct wc_artifact_key {
  uint32_t struct_size; /* sizeof(wc_artifact_key), set by wc_artifact_key_init */
  const char* kind;     /* e.g. "torch-compile", "dir:triton" */
  const char* model;
  const char* fingerprint; /* of the weights the engine mapped */
  const char* engine;
  const char* engine_version;
  const char* torch_version;
  const char* triton_version;
  const char* cuda_version;
  const char* compute_capability; /* "9.0" */
  const char* settings_hash;      /* the engine's compile settings, hashed */
} wc_artifact_key;

WC_API void wc_artifact_key_init(wc_artifact_key* key);
/* Stores `size` bytes under `key`. WC_ALREADY_EXISTS when stored already (nothing changes),
 * WC_ABORTED while another engine puts the same key, WC_PERMISSION_DENIED without the publish
 * role, WC_RESOURCE_EXHAUSTED over the daemon's --artifact_budget. */
WC_API wc_status wc_artifact_put(wc_client* client, const wc_artifact_key* key, const void* data,
                                 uint64_t size, char** error);
/* Maps the artifact read-only; *out owns it (wc_artifact_free). WC_NOT_FOUND when absent;
 * wait_ms > 0 waits that long for a put in flight. */
WC_API wc_status wc_artifact_get(wc_client* client, const wc_artifact_key* key, int64_t wait_ms,
                                 wc_artifact** out, char** error);
/* The mapped bytes (read-only), their count, the id ("art-..."); valid while it lives. */
WC_API const void* wc_artifact_data(const wc_artifact* artifact);
WC_API uint64_t wc_artifact_size(const wc_artifact* artifact);
WC_API const char* wc_artifact_id(const wc_artifact* artifact);
/* Unmaps and frees. NULL is a no-op. */
WC_API void wc_artifact_free(wc_artifact* artifact);

#ifdef __cplusplus
}
#endif

#endif /* WEIGHTCACHE_WEIGHTCACHE_H_ */
