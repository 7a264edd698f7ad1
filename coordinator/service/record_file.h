// Record files: the bytes of one state-dir record (a job's, the pool's)
// with a checksum, so that a record changed on the disk — a flipped bit, a
// torn sector, a hand edit — reads back as DATA_LOSS instead of as a
// different, still parseable record. A framed file is the serialized
// record followed by a 12-byte trailer: "DYNMOCRC" and the CRC-32 (zlib's)
// of the record's bytes, little-endian. A file without the trailer is a
// record of an older coordinator and is taken as it is (its next commit
// frames it).
//
// Pure functions; thread-safe.
#ifndef DYNMO_COORDINATOR_SERVICE_RECORD_FILE_H_
#define DYNMO_COORDINATOR_SERVICE_RECORD_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::service {

// `record` with its trailer.
std::string FramedRecord(absl::string_view record);

// The record bytes of a file's contents: without the trailer when it has
// one whose checksum matches; DATA_LOSS naming `path` when it does not;
// the contents unchanged when there is no trailer (an older file).
absl::StatusOr<std::string> UnframedRecord(std::string contents, absl::string_view path);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_RECORD_FILE_H_
