#include "kernels/block_sparse_attention_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/kernels/random_matrices.h"

namespace dynmo::kernels {
namespace {

using testing::RandomDense;

// Dense causal softmax attention, in double, restricted to keys j with
// allowed(t, j) (and j <= t).
template <typename Allowed>
std::vector<float> NaiveAttention(const AttentionShape& s,
                                  const std::vector<float>& q,
                                  const std::vector<float>& k,
                                  const std::vector<float>& v, float scale,
                                  Allowed allowed) {
  const int64_t T = s.seq_len, D = s.head_dim;
  std::vector<float> out(q.size());
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p(T, 0.0);
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        if (!allowed(h, t, j)) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          dot += double{q[(h * T + t) * D + d]} * k[(h * T + j) * D + d];
        }
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j <= t; ++j) {
        if (!allowed(h, t, j)) continue;
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) {
          if (allowed(h, t, j)) o += p[j] / sum * v[(h * T + j) * D + d];
        }
        out[(h * T + t) * D + d] = static_cast<float>(o);
      }
    }
  }
  return out;
}

struct Inputs {
  AttentionShape shape;
  std::vector<float> q, k, v;
  float scale;
};

// seq_len 45 with blocks of 8: six blocks, the last one short.
Inputs MakeInputs() {
  Inputs in;
  in.shape = {/*heads=*/3, /*seq_len=*/45, /*head_dim=*/16, /*block_size=*/8};
  const int64_t size = in.shape.heads * in.shape.seq_len * in.shape.head_dim;
  in.q = RandomDense(size, 1);
  in.k = RandomDense(size, 2);
  in.v = RandomDense(size, 3);
  in.scale = 1.0f / std::sqrt(16.0f);
  return in;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_NEAR(got[j], want[j], 1e-5f) << "at " << j;
  }
}

TEST(BlockSparseAttentionTest, OneSharedBucketIsDenseCausalAttention) {
  Inputs in = MakeInputs();
  const int64_t nb = in.shape.num_blocks();
  ASSERT_EQ(nb, 6);
  const std::vector<int32_t> buckets(in.shape.heads * nb, 42);
  std::vector<float> out(in.q.size());
  auto count = BlockSparseCausalAttention(in.shape, in.q, in.k, in.v, buckets,
                                          buckets, in.scale,
                                          absl::MakeSpan(out));
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, in.shape.heads * nb * (nb + 1) / 2);  // Every causal block.
  ExpectNear(out, NaiveAttention(in.shape, in.q, in.k, in.v, in.scale,
                                 [](int64_t, int64_t, int64_t) { return true; }));
}

TEST(BlockSparseAttentionTest, AttendsOnlyDiagonalAndMatchingBuckets) {
  Inputs in = MakeInputs();
  const int64_t nb = in.shape.num_blocks(), B = in.shape.block_size;
  std::vector<int32_t> qb(in.shape.heads * nb), kb(in.shape.heads * nb);
  for (size_t j = 0; j < qb.size(); ++j) {
    qb[j] = static_cast<int32_t>((j * 7) % 3);
    kb[j] = static_cast<int32_t>((j * 5) % 3);
  }
  std::vector<float> out(in.q.size());
  auto count = BlockSparseCausalAttention(in.shape, in.q, in.k, in.v, qb, kb,
                                          in.scale, absl::MakeSpan(out));
  ASSERT_TRUE(count.ok()) << count.status();
  auto allowed = [&](int64_t h, int64_t t, int64_t j) {
    const int64_t tb = t / B, jb = j / B;
    return tb == jb || qb[h * nb + tb] == kb[h * nb + jb];
  };
  ExpectNear(out, NaiveAttention(in.shape, in.q, in.k, in.v, in.scale, allowed));
  int64_t want = 0;
  for (int64_t h = 0; h < in.shape.heads; ++h) {
    for (int64_t a = 0; a < nb; ++a) {
      for (int64_t b = 0; b <= a; ++b) {
        want += a == b || qb[h * nb + a] == kb[h * nb + b];
      }
    }
  }
  EXPECT_EQ(*count, want);
  EXPECT_EQ(*CountAttendedBlocks(in.shape, qb, kb), want);
}

TEST(BlockSparseAttentionTest, MoreBucketsAttendFewerBlocks) {
  AttentionShape shape{/*heads=*/4, /*seq_len=*/1024, /*head_dim=*/8,
                       /*block_size=*/16};
  const int64_t nb = shape.num_blocks();
  int64_t previous = std::numeric_limits<int64_t>::max();
  for (int32_t buckets : {1, 2, 4, 8, 64}) {
    // Each block's id cycles through the buckets: a deterministic stand-in
    // for a hash that spreads blocks evenly.
    std::vector<int32_t> ids(shape.heads * nb);
    for (size_t j = 0; j < ids.size(); ++j) ids[j] = static_cast<int32_t>(j % buckets);
    auto count = CountAttendedBlocks(shape, ids, ids);
    ASSERT_TRUE(count.ok());
    EXPECT_LT(*count, previous) << buckets << " buckets";
    EXPECT_GE(*count, shape.heads * nb);  // The diagonal, at least.
    previous = *count;
  }
  EXPECT_EQ(previous, shape.heads * nb);  // 64 buckets = 64 blocks: diagonal only.
}

TEST(BlockSparseAttentionTest, RejectsBadShapesAndSizes) {
  Inputs in = MakeInputs();
  std::vector<float> out(in.q.size());
  const std::vector<int32_t> ids(in.shape.heads * in.shape.num_blocks(), 0);
  const std::vector<int32_t> short_ids(ids.size() - 1, 0);
  EXPECT_FALSE(BlockSparseCausalAttention(in.shape, in.q, in.k, in.v, short_ids,
                                          ids, in.scale, absl::MakeSpan(out))
                   .ok());
  std::vector<float> short_out(out.size() - 1);
  EXPECT_FALSE(BlockSparseCausalAttention(in.shape, in.q, in.k, in.v, ids, ids,
                                          in.scale, absl::MakeSpan(short_out))
                   .ok());
  AttentionShape zero_block = in.shape;
  zero_block.block_size = 0;
  EXPECT_FALSE(CountAttendedBlocks(zero_block, {}, {}).ok());
}

}  // namespace
}  // namespace dynmo::kernels
