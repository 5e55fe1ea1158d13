/* A C program over the weightcache C ABI, run by python/tests/test_capi.py against a real
 * daemon: acquires MODEL, prints the lease and every tensor (name, dtype, shape, bytes and an
 * FNV-1a-64 of its bytes on the host backend), exercises the error paths, and prints the
 * daemon's status before and after closing the lease.
 *
 *   wc_capi_example SOCKET MODEL
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weightcache/weightcache.h"

static uint64_t Fnv1a64(const unsigned char* p, uint64_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (uint64_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

static int Check(wc_status s, char* err, const char* what) {
  if (s == WC_OK) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, wc_status_name(s), err != NULL ? err : "(no message)");
  wc_string_free(err);
  return 1;
}

static int PrintStatus(wc_client* c, const char* label) {
  char* json = NULL;
  char* err = NULL;
  if (Check(wc_status_json(c, &json, &err), err, "wc_status_json")) return 1;
  printf("status %s %s\n", label, json);
  wc_string_free(json);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SOCKET MODEL\n", argv[0]);
    return 2;
  }
  if (wc_abi_version() != WC_ABI_VERSION) {
    fprintf(stderr, "ABI %d, header %d\n", wc_abi_version(), WC_ABI_VERSION);
    return 1;
  }
  printf("version %s abi %d\n", wc_version(), wc_abi_version());
  wc_client* c = NULL;
  char* err = NULL;
  if (Check(wc_connect(argv[1], &c, &err), err, "wc_connect")) return 1;

  wc_acquire_options o;
  wc_acquire_options_init(&o);
  o.model = "no-such-model";
  wc_lease* lease = NULL;
  wc_status s = wc_acquire(c, &o, &lease, &err);
  printf("miss %s %s\n", wc_status_name(s), err != NULL ? err : "");
  wc_string_free(err);
  err = NULL;

  o.tp_rank = 3; /* tp 3/1: refused before any call */
  s = wc_acquire(c, &o, &lease, &err);
  printf("bad-layout %s %s\n", wc_status_name(s), err != NULL ? err : "");
  wc_string_free(err);
  err = NULL;

  wc_acquire_options_init(&o);
  o.model = argv[2];
  o.wait_ready = 1;
  if (Check(wc_acquire(c, &o, &lease, &err), err, "wc_acquire")) return 1;
  wc_lease_info info;
  wc_lease_info_get(lease, &info);
  printf("lease %s model %s backend %s tensors %" PRIu64 " segments %" PRIu64 " bytes %" PRIu64
         " tp %d/%d\n",
         info.id, info.model, info.backend, info.tensor_count, info.segment_count, info.total_bytes,
         info.tp_rank, info.tp_size);
  for (uint64_t i = 0; i < info.tensor_count; ++i) {
    wc_tensor t;
    if (Check(wc_lease_tensor(lease, i, &t, &err), err, "wc_lease_tensor")) return 1;
    const void* base = NULL;
    uint64_t size = 0;
    if (Check(wc_lease_segment(lease, t.segment, &base, &size, &err), err, "wc_lease_segment")) {
      return 1;
    }
    if ((const char*)t.data != (const char*)base + t.offset || t.offset + t.nbytes > size) {
      fprintf(stderr, "tensor %s lies outside its segment\n", t.name);
      return 1;
    }
    printf("tensor %s %s ", t.name, t.dtype);
    for (int d = 0; d < t.ndim; ++d) printf("%s%" PRId64, d ? "," : "", t.shape[d]);
    printf(" %" PRIu64 " %016" PRIx64 "\n", t.nbytes,
           strcmp(info.backend, "host") == 0 ? Fnv1a64((const unsigned char*)t.data, t.nbytes) : 0);
  }
  wc_tensor t;
  s = wc_lease_tensor(lease, info.tensor_count, &t, &err);
  printf("past-end %s %s\n", wc_status_name(s), err != NULL ? err : "");
  wc_string_free(err);
  err = NULL;
  s = wc_lease_find(lease, "no.such.tensor", &t, &err);
  printf("find-missing %s %s\n", wc_status_name(s), err != NULL ? err : "");
  wc_string_free(err);
  err = NULL;

  if (PrintStatus(c, "leased")) return 1;
  wc_lease_close(lease);
  if (PrintStatus(c, "closed")) return 1;
  wc_client_free(c);
  return 0;
}
