#include "coordinator/service/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dynmo::service {

absl::StatusOr<BearerAuth> BearerAuth::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buf.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " is empty"));
  }
  return BearerAuth(std::move(token));
}

grpc::Status BearerAuth::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  const std::string got(it->second.data(), it->second.size());
  const std::string want = "Bearer " + token_;
  // Constant-time over the expected length: no early exit on a mismatch.
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const unsigned char g = i < got.size() ? got[i] : 0;
    diff |= static_cast<unsigned char>(g ^ want[i]);
  }
  if (diff != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

}  // namespace dynmo::service
