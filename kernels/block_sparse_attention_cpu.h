// Hash-based block-sparse causal attention (after Pagliardini et al., "Fast
// attention over long sequences"), CPU reference.
//
// The sequence is cut into blocks of `block_size` tokens (the last may be
// shorter). Per head, every query block and every key block carries a bucket
// id (the caller hashes queries/keys, e.g. by LSH, and picks one id per
// block). Query block qb attends key block kb when
//
//   kb == qb                                   (the diagonal, always), or
//   kb <  qb and q_bucket[h][qb] == k_bucket[h][kb].
//
// Inside the diagonal block the usual token-level causal mask applies. The
// softmax runs over exactly the attended keys, so with a single bucket this
// is dense causal attention, and with more buckets fewer blocks are computed.
// The returned count of attended (head, query block, key block) pairs is the
// work measure the trainer reports. Stateless; thread-compatible.
#ifndef DYNMO_KERNELS_BLOCK_SPARSE_ATTENTION_CPU_H_
#define DYNMO_KERNELS_BLOCK_SPARSE_ATTENTION_CPU_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dynmo::kernels {

struct AttentionShape {
  int64_t heads = 0;
  int64_t seq_len = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;

  // ceil(seq_len / block_size).
  int64_t num_blocks() const {
    return block_size > 0 ? (seq_len + block_size - 1) / block_size : 0;
  }
};

// Returns how many (head, query block, key block) pairs the rule above
// attends. q_buckets and k_buckets are [heads, num_blocks].
absl::StatusOr<int64_t> CountAttendedBlocks(const AttentionShape& shape,
                                            absl::Span<const int32_t> q_buckets,
                                            absl::Span<const int32_t> k_buckets);

// Writes out [heads, seq_len, head_dim] = softmax(q·kᵀ · scale) · v over the
// attended keys, for q, k, v [heads, seq_len, head_dim] (row-major), and
// returns the attended block count. `scale` is usually 1/sqrt(head_dim).
absl::StatusOr<int64_t> BlockSparseCausalAttention(
    const AttentionShape& shape, absl::Span<const float> q,
    absl::Span<const float> k, absl::Span<const float> v,
    absl::Span<const int32_t> q_buckets, absl::Span<const int32_t> k_buckets,
    float scale, absl::Span<float> out);

}  // namespace dynmo::kernels

#endif  // DYNMO_KERNELS_BLOCK_SPARSE_ATTENTION_CPU_H_
