#include "coordinator/service/record_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dynmo::service {
namespace {

constexpr absl::string_view kMagic = "DYNMOCRC";
constexpr size_t kTrailer = 12;

uint32_t Crc(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes at most uInt bytes a call.
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

std::string FramedRecord(absl::string_view record) {
  std::string out(record);
  out.append(kMagic.data(), kMagic.size());
  const uint32_t crc = Crc(record);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  return out;
}

absl::StatusOr<std::string> UnframedRecord(std::string contents, absl::string_view path) {
  if (contents.size() < kTrailer ||
      absl::string_view(contents).substr(contents.size() - kTrailer, kMagic.size()) != kMagic) {
    return contents;  // an older coordinator's file: no checksum
  }
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<unsigned char>(
                  contents[contents.size() - 4 + static_cast<size_t>(i)]))
              << (8 * i);
  }
  contents.resize(contents.size() - kTrailer);
  const uint32_t actual = Crc(contents);
  if (actual != stored) {
    return absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch (stored %08x, the bytes give %08x): the file was changed on disk",
        path, stored, actual));
  }
  return contents;
}

}  // namespace dynmo::service
