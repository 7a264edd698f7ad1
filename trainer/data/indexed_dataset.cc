#include "trainer/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;

int BytesOf(IndexedDType t) {
  switch (t) {
    case IndexedDType::kUInt8:
    case IndexedDType::kInt8: return 1;
    case IndexedDType::kInt16:
    case IndexedDType::kUInt16: return 2;
    case IndexedDType::kInt32: return 4;
    case IndexedDType::kInt64: return 8;
  }
  return 0;
}

bool Fits(IndexedDType t, int64_t v) {
  switch (t) {
    case IndexedDType::kUInt8: return v >= 0 && v <= 255;
    case IndexedDType::kInt8: return v >= -128 && v <= 127;
    case IndexedDType::kInt16: return v >= -32768 && v <= 32767;
    case IndexedDType::kUInt16: return v >= 0 && v <= 65535;
    case IndexedDType::kInt32:
      return v >= std::numeric_limits<int32_t>::min() &&
             v <= std::numeric_limits<int32_t>::max();
    case IndexedDType::kInt64: return true;
  }
  return false;
}

// Reads a little-endian POD from `data` at `*pos`; false when truncated.
template <typename T>
bool Take(const std::string& data, size_t* pos, T* out) {
  if (*pos + sizeof(T) > data.size()) return false;
  std::memcpy(out, data.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

template <typename T>
bool TakeArray(const std::string& data, size_t* pos, uint64_t n,
               std::vector<T>* out) {
  if (n > (data.size() - std::min(*pos, data.size())) / sizeof(T)) return false;
  out->resize(n);
  if (n > 0) std::memcpy(out->data(), data.data() + *pos, n * sizeof(T));
  *pos += n * sizeof(T);
  return true;
}

}  // namespace

IndexedDataset::~IndexedDataset() {
  if (bin_ != nullptr && bin_bytes_ > 0) {
    munmap(const_cast<uint8_t*>(bin_), bin_bytes_);
  }
}

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(
    const std::string& prefix) {
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  std::ifstream idx(idx_path, std::ios::binary);
  if (!idx) return absl::NotFoundError(absl::StrCat("cannot open ", idx_path));
  std::string data((std::istreambuf_iterator<char>(idx)),
                   std::istreambuf_iterator<char>());
  auto corrupt = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(idx_path, ": ", what));
  };
  if (data.size() < sizeof(kMagic) ||
      std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a Megatron MMIDIDX index (bad magic)");
  }
  size_t pos = sizeof(kMagic);
  uint64_t version = 0, num_sequences = 0, num_doc_idx = 0;
  uint8_t code = 0;
  if (!Take(data, &pos, &version) || !Take(data, &pos, &code)) {
    return corrupt("truncated header");
  }
  if (version != kVersion) {
    return corrupt(absl::StrCat("unsupported version ", version));
  }
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  switch (code) {
    case 1: case 2: case 3: case 4: case 5: case 8:
      ds->dtype_ = static_cast<IndexedDType>(code);
      break;
    default:
      return corrupt(absl::StrCat("dtype code ", int{code},
                                  " is not an integer token type"));
  }
  ds->token_bytes_ = BytesOf(ds->dtype_);
  if (!Take(data, &pos, &num_sequences) || !Take(data, &pos, &num_doc_idx) ||
      !TakeArray(data, &pos, num_sequences, &ds->sizes_) ||
      !TakeArray(data, &pos, num_sequences, &ds->pointers_) ||
      !TakeArray(data, &pos, num_doc_idx, &ds->doc_idx_)) {
    return corrupt("truncated index arrays");
  }

  int fd = ::open(bin_path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", bin_path));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", bin_path));
  }
  ds->bin_bytes_ = static_cast<size_t>(st.st_size);
  if (ds->bin_bytes_ > 0) {
    void* p = mmap(nullptr, ds->bin_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot mmap ", bin_path));
    }
    ds->bin_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);

  ds->stream_starts_.reserve(num_sequences + 1);
  int64_t total = 0;
  for (uint64_t i = 0; i < num_sequences; ++i) {
    const int64_t n = ds->sizes_[i];
    const int64_t off = ds->pointers_[i];
    if (n < 0 || off < 0 ||
        static_cast<uint64_t>(off) + static_cast<uint64_t>(n) * ds->token_bytes_ >
            ds->bin_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          bin_path, ": sequence ", i, " (", n, " tokens at byte ", off,
          ") runs past the end of the file (", ds->bin_bytes_, " bytes)"));
    }
    ds->stream_starts_.push_back(total);
    total += n;
    for (int64_t t = 0; t < n; ++t) {
      ds->max_token_ =
          std::max(ds->max_token_, ds->TokenAt(off + t * ds->token_bytes_));
    }
  }
  ds->stream_starts_.push_back(total);
  ds->total_tokens_ = total;
  return ds;
}

int64_t IndexedDataset::TokenAt(int64_t byte_offset) const {
  const uint8_t* p = bin_ + byte_offset;
  switch (dtype_) {
    case IndexedDType::kUInt8: return *p;
    case IndexedDType::kInt8: return static_cast<int8_t>(*p);
    case IndexedDType::kInt16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case IndexedDType::kUInt16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case IndexedDType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case IndexedDType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
  return 0;
}

std::vector<int64_t> IndexedDataset::Sequence(int64_t i) const {
  std::vector<int64_t> out(sizes_[i]);
  for (int64_t t = 0; t < sizes_[i]; ++t) {
    out[t] = TokenAt(pointers_[i] + t * token_bytes_);
  }
  return out;
}

void IndexedDataset::Read(int64_t start, absl::Span<int64_t> out) const {
  // The sequence holding `start`: the last one whose stream start is <= it.
  auto it = std::upper_bound(stream_starts_.begin(), stream_starts_.end(), start);
  int64_t seq = (it - stream_starts_.begin()) - 1;
  int64_t within = start - stream_starts_[seq];
  for (size_t k = 0; k < out.size(); ++k) {
    while (within >= sizes_[seq]) {
      ++seq;
      within = 0;
    }
    out[k] = TokenAt(pointers_[seq] + within * token_bytes_);
    ++within;
  }
}

absl::Status WriteIndexedDataset(const std::string& prefix, IndexedDType dtype,
                                 absl::Span<const std::vector<int64_t>> documents) {
  const int bytes = BytesOf(dtype);
  std::ofstream bin(prefix + ".bin", std::ios::binary | std::ios::trunc);
  if (!bin) return absl::InternalError(absl::StrCat("cannot write ", prefix, ".bin"));
  std::vector<int32_t> sizes;
  std::vector<int64_t> pointers;
  std::vector<int64_t> doc_idx = {0};
  int64_t offset = 0;
  for (const std::vector<int64_t>& doc : documents) {
    sizes.push_back(static_cast<int32_t>(doc.size()));
    pointers.push_back(offset);
    for (int64_t t : doc) {
      if (!Fits(dtype, t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", t, " does not fit dtype code ", static_cast<int>(dtype)));
      }
      char buf[8];
      std::memcpy(buf, &t, 8);  // little-endian: the low bytes come first
      bin.write(buf, bytes);
    }
    offset += static_cast<int64_t>(doc.size()) * bytes;
    doc_idx.push_back(static_cast<int64_t>(sizes.size()));
  }
  std::ofstream idx(prefix + ".idx", std::ios::binary | std::ios::trunc);
  if (!idx) return absl::InternalError(absl::StrCat("cannot write ", prefix, ".idx"));
  idx.write(kMagic, sizeof(kMagic));
  const uint64_t version = kVersion, n = sizes.size(), d = doc_idx.size();
  const uint8_t code = static_cast<uint8_t>(dtype);
  idx.write(reinterpret_cast<const char*>(&version), 8);
  idx.write(reinterpret_cast<const char*>(&code), 1);
  idx.write(reinterpret_cast<const char*>(&n), 8);
  idx.write(reinterpret_cast<const char*>(&d), 8);
  idx.write(reinterpret_cast<const char*>(sizes.data()), n * 4);
  idx.write(reinterpret_cast<const char*>(pointers.data()), n * 8);
  idx.write(reinterpret_cast<const char*>(doc_idx.data()), d * 8);
  if (!bin || !idx) return absl::InternalError(absl::StrCat("short write to ", prefix));
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
