// The keeper record: what the daemon deposits beside an entry's descriptors (its manifest,
// fingerprint inputs, the files' identity, the spec it was loaded under, who published it),
// and back. Pure functions, no I/O: the link (keeper_link.h) moves the bytes.
// Not a public header.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/loader.h"
#include "pkg/spec/spec.h"
#include "weightcache/v1/keeper_record.pb.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

// The record of a ready entry (what the keeper keeps beside its descriptors), and back:
// pure functions. Decoding checks the format, that the fingerprint inputs reproduce the
// fingerprint and that every tensor lies inside its segment; INVALID_ARGUMENT naming the
// field otherwise.
// `publisher`: who published a published entry (null for a loaded one).
// The spec an entry was loaded under, as recorded with its deposit.
struct RecordedSpec {
  std::string yaml;             // canonical YAML; empty when unknown
  bool defined_inline = false;  // an admin's inline spec, not the spec file's
};
// `digests`: the entry's segment digests (their cryptographic digests go into the record); a
// record without them is refused when decoded.
std::string EncodeKeeperRecord(const cache::Entry& e, const load::LoadedModel& content,
                               const std::string& backend, const RecordedSpec& spec,
                               const v1::PublisherInfo* publisher = nullptr,
                               const std::vector<integrity::SegmentDigest>* digests = nullptr);
// The adoption check of a record's digests (cache::LoadRequest::check_digests): DATA_LOSS
// naming the segments whose cryptographic digest differs from the record's (the registry's
// digester computes them over the adopted memory).
cache::DigestCheckFn AdoptionDigestCheck(const v1::KeeperRecord& r);
struct AdoptableRecord {
  v1::KeeperRecord record;
  spec::FingerprintInputs inputs;
  std::vector<load::SourceFile> files;
  load::Plan plan;
};
absl::StatusOr<AdoptableRecord> DecodeKeeperRecord(const std::string& body);

// The key an entry is kept under: "<fingerprint>@<device>".
std::string KeeperKey(const std::string& fingerprint, const std::string& device);

}  // namespace weightcache::server
