#include "launcher/line_prefixer.h"

#include "gtest/gtest.h"

namespace dynmo::launcher {
namespace {

TEST(LinePrefixerTest, PrefixesEveryCompleteLine) {
  LinePrefixer p("[rank 2] ");
  EXPECT_EQ(p.Append("a\nbc\n\n"), "[rank 2] a\n[rank 2] bc\n[rank 2] \n");
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixerTest, HoldsAPartialLineUntilItsNewlineArrives) {
  LinePrefixer p("[rank 0] ");
  EXPECT_EQ(p.Append("hel"), "");
  EXPECT_EQ(p.Append("lo wor"), "");
  EXPECT_EQ(p.Append("ld\nnext"), "[rank 0] hello world\n");
  EXPECT_EQ(p.Append("\n"), "[rank 0] next\n");
}

TEST(LinePrefixerTest, FinishEndsAnUnterminatedLastLine) {
  LinePrefixer p("[rank 1] ");
  EXPECT_EQ(p.Append("done\ntail"), "[rank 1] done\n");
  EXPECT_EQ(p.Finish(), "[rank 1] tail\n");
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixerTest, CutsALineLongerThanTheLimitIntoPrefixedPieces) {
  LinePrefixer p("> ", 4);
  EXPECT_EQ(p.Append("abcdefghij"), "> abcd\n> efgh\n");
  EXPECT_EQ(p.Append("\n"), "> ij\n");
}

}  // namespace
}  // namespace dynmo::launcher
