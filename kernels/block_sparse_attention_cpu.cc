#include "kernels/block_sparse_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dynmo::kernels {
namespace {

absl::Status CheckShape(const AttentionShape& shape,
                        absl::Span<const int32_t> q_buckets,
                        absl::Span<const int32_t> k_buckets) {
  if (shape.heads < 0 || shape.seq_len < 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0) {
    return absl::InvalidArgumentError(
        "attention shape needs heads >= 0, seq_len >= 0, head_dim > 0 and "
        "block_size > 0");
  }
  const int64_t buckets = shape.heads * shape.num_blocks();
  if (static_cast<int64_t>(q_buckets.size()) != buckets ||
      static_cast<int64_t>(k_buckets.size()) != buckets) {
    return absl::InvalidArgumentError(
        "q_buckets and k_buckets must hold heads * num_blocks = " +
        std::to_string(buckets) + " ids, got " +
        std::to_string(q_buckets.size()) + " and " +
        std::to_string(k_buckets.size()));
  }
  return absl::OkStatus();
}

bool Attends(int64_t qb, int64_t kb, const int32_t* qbuck,
             const int32_t* kbuck) {
  return kb == qb || (kb < qb && qbuck[qb] == kbuck[kb]);
}

}  // namespace

absl::StatusOr<int64_t> CountAttendedBlocks(const AttentionShape& shape,
                                            absl::Span<const int32_t> q_buckets,
                                            absl::Span<const int32_t> k_buckets) {
  if (absl::Status s = CheckShape(shape, q_buckets, k_buckets); !s.ok()) {
    return s;
  }
  const int64_t nb = shape.num_blocks();
  int64_t count = 0;
  for (int64_t h = 0; h < shape.heads; ++h) {
    const int32_t* qbuck = q_buckets.data() + h * nb;
    const int32_t* kbuck = k_buckets.data() + h * nb;
    for (int64_t qb = 0; qb < nb; ++qb) {
      for (int64_t kb = 0; kb <= qb; ++kb) count += Attends(qb, kb, qbuck, kbuck);
    }
  }
  return count;
}

absl::StatusOr<int64_t> BlockSparseCausalAttention(
    const AttentionShape& shape, absl::Span<const float> q,
    absl::Span<const float> k, absl::Span<const float> v,
    absl::Span<const int32_t> q_buckets, absl::Span<const int32_t> k_buckets,
    float scale, absl::Span<float> out) {
  if (absl::Status s = CheckShape(shape, q_buckets, k_buckets); !s.ok()) {
    return s;
  }
  const int64_t T = shape.seq_len, D = shape.head_dim, B = shape.block_size;
  const int64_t nb = shape.num_blocks();
  const size_t elements = static_cast<size_t>(shape.heads * T * D);
  if (q.size() != elements || k.size() != elements || v.size() != elements ||
      out.size() != elements) {
    return absl::InvalidArgumentError(
        "q, k, v and out must each hold heads * seq_len * head_dim = " +
        std::to_string(elements) + " floats");
  }
  // Scratch sized once: the attended key blocks of one query block, and the
  // scores of one query against every key it may see.
  std::vector<int64_t> key_blocks;
  key_blocks.reserve(nb);
  std::vector<float> scores(static_cast<size_t>(T));
  int64_t count = 0;
  for (int64_t h = 0; h < shape.heads; ++h) {
    const float* qh = q.data() + h * T * D;
    const float* kh = k.data() + h * T * D;
    const float* vh = v.data() + h * T * D;
    float* oh = out.data() + h * T * D;
    const int32_t* qbuck = q_buckets.data() + h * nb;
    const int32_t* kbuck = k_buckets.data() + h * nb;
    for (int64_t qb = 0; qb < nb; ++qb) {
      key_blocks.clear();
      for (int64_t kb = 0; kb <= qb; ++kb) {
        if (Attends(qb, kb, qbuck, kbuck)) key_blocks.push_back(kb);
      }
      count += static_cast<int64_t>(key_blocks.size());
      const int64_t q_end = std::min(T, (qb + 1) * B);
      for (int64_t t = qb * B; t < q_end; ++t) {
        const float* qt = qh + t * D;
        // Scores, in key-block order; the diagonal block stops at key t.
        float max_score = -std::numeric_limits<float>::infinity();
        int64_t m = 0;
        for (int64_t kb : key_blocks) {
          const int64_t k_end = kb == qb ? t + 1 : (kb + 1) * B;
          for (int64_t j = kb * B; j < k_end; ++j) {
            const float* kj = kh + j * D;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; ++d) dot += qt[d] * kj[d];
            scores[m] = dot * scale;
            max_score = std::max(max_score, scores[m]);
            ++m;
          }
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < m; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        const float inv = 1.0f / sum;  // m >= 1: key t itself is always seen.
        float* ot = oh + t * D;
        std::fill(ot, ot + D, 0.0f);
        m = 0;
        for (int64_t kb : key_blocks) {
          const int64_t k_end = kb == qb ? t + 1 : (kb + 1) * B;
          for (int64_t j = kb * B; j < k_end; ++j) {
            const float p = scores[m++] * inv;
            const float* vj = vh + j * D;
            for (int64_t d = 0; d < D; ++d) ot[d] += p * vj[d];
          }
        }
      }
    }
  }
  return count;
}

}  // namespace dynmo::kernels
