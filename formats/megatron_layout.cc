#include "formats/megatron_layout.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dynmo::formats {
namespace {

constexpr int kMaxLayers = kMaxSplitLayers;

absl::Status Bad(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// An error about `layout`, shown as given (its first 80 characters).
absl::Status LayoutError(absl::string_view layout, absl::string_view why) {
  std::string shown = absl::CHexEscape(layout.substr(0, 80));  // one line
  if (layout.size() > 80) shown += "...";
  return Bad(absl::StrCat("Megatron layout \"", shown, "\" ", why));
}

bool IsLayoutUnit(char c) {
  return c == 'E' || c == 't' || c == 'L' || c == 'm' || c == '|';
}

// Unrolls a layout the way Megatron's parser does: commas dropped,
// "(...)*N" and then "x*N" repeated. Nested parentheses are refused, as
// Megatron's parser cannot read them either.
class LayoutExpander {
 public:
  explicit LayoutExpander(absl::string_view layout) : layout_(layout) {
    for (char c : layout) {
      if (c != ',') text_ += c;
    }
  }

  absl::StatusOr<std::string> Expand() {
    if (text_.empty()) return Fail("is empty");
    std::string out;
    size_t i = 0;
    while (i < text_.size()) {
      const size_t open = text_.find_first_of("()", i);
      if (open == std::string::npos) {
        if (absl::Status st = Flat(absl::string_view(text_).substr(i), out); !st.ok()) {
          return st;
        }
        break;
      }
      if (absl::Status st = Flat(absl::string_view(text_).substr(i, open - i), out);
          !st.ok()) {
        return st;
      }
      if (text_[open] == ')') return Fail("has a ')' with no '('");
      const size_t close = text_.find_first_of("()", open + 1);
      if (close == std::string::npos) return Fail("has a '(' with no ')'");
      if (text_[close] == '(') return Fail("nests parentheses");
      if (close == open + 1) return Fail("has an empty '()'");
      i = close + 1;
      if (i >= text_.size() || text_[i] != '*') {
        return Fail("must repeat a '(...)' group: write '(...)*N'");
      }
      absl::StatusOr<int> n = Count(text_, i);
      if (!n.ok()) return n.status();
      std::string group;
      if (absl::Status st =
              Flat(absl::string_view(text_).substr(open + 1, close - open - 1), group);
          !st.ok()) {
        return st;
      }
      if (absl::Status st = Append(out, group, *n); !st.ok()) return st;
    }
    return out;
  }

 private:
  absl::Status Fail(absl::string_view why) const { return LayoutError(layout_, why); }

  // Reads "*N" at text[i] == '*', leaving i after N.
  absl::StatusOr<int> Count(absl::string_view text, size_t& i) const {
    const size_t start = ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    int n = 0;
    if (i == start) return Fail("has a '*' with no repeat count after it");
    if (i - start > 7 || !absl::SimpleAtoi(text.substr(start, i - start), &n) ||
        n > kMaxLayers) {
      return Fail(absl::StrCat("repeats more than ", kMaxLayers, " times"));
    }
    return n;
  }

  absl::Status Append(std::string& out, absl::string_view piece, int times) const {
    if (out.size() + piece.size() * static_cast<size_t>(times) > 4u * kMaxLayers) {
      return Fail(absl::StrCat("expands to more than ", 4 * kMaxLayers, " entries"));
    }
    for (int k = 0; k < times; ++k) out.append(piece.data(), piece.size());
    return absl::OkStatus();
  }

  // Expands text without parentheses: letters, '|' and "x*N".
  absl::Status Flat(absl::string_view piece, std::string& out) const {
    size_t i = 0;
    while (i < piece.size()) {
      const char c = piece[i];
      if (c == '*') return Fail("has a '*' that follows no layer letter, '|' or ')'");
      if (!IsLayoutUnit(c)) {
        return Fail(absl::StrCat("has '", absl::CHexEscape(std::string(1, c)),
                                 "', not a layer letter (E, t, L), '|', '*N' or '(...)*N'"));
      }
      ++i;
      int times = 1;
      if (i < piece.size() && piece[i] == '*') {
        absl::StatusOr<int> n = Count(piece, i);
        if (!n.ok()) return n.status();
        times = *n;
      }
      if (absl::Status st = Append(out, std::string(1, c), times); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::string_view layout_;  // as given, for messages
  std::string text_;          // without commas
};

}  // namespace

std::string WriteMegatronLayout(absl::Span<const int> b) {
  const int num_layers = b.back();
  std::vector<std::string> stages;
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    std::string stage;
    if (b[s] == 0) stage += 'E';
    const int blocks = std::min(b[s + 1], num_layers - 1) - std::max(b[s], 1);
    if (blocks == 1) absl::StrAppend(&stage, "t");
    if (blocks > 1) absl::StrAppend(&stage, "t*", blocks);
    if (b[s + 1] == num_layers) absl::StrAppend(&stage, blocks > 0 ? ",L" : "L");
    stages.push_back(std::move(stage));
  }
  return absl::StrJoin(stages, "|");
}

absl::StatusOr<core::Boundaries> ReadMegatronLayout(absl::string_view given, int num_layers_expected,
                                                    int num_stages_expected) {
  const absl::string_view layout = absl::StripAsciiWhitespace(given);
  absl::StatusOr<std::string> expanded = LayoutExpander(layout).Expand();
  if (!expanded.ok()) return expanded.status();
  auto fail = [&](absl::string_view why) { return LayoutError(layout, why); };
  if (expanded->find('m') != std::string::npos) {
    return fail("holds MTP layers ('m'), which have no DynMo layer; leave them out");
  }
  const std::vector<absl::string_view> stages = absl::StrSplit(*expanded, '|');
  const int num_stages = static_cast<int>(stages.size());
  if (num_stages_expected >= 0 && num_stages != num_stages_expected) {
    return fail(absl::StrCat("has ", num_stages, " stages; the model has ",
                             num_stages_expected));
  }
  std::string layers;
  for (int s = 0; s < num_stages; ++s) {
    if (stages[s].empty()) {
      return fail(absl::StrCat("leaves stage ", s,
                               " empty; every stage holds at least one layer"));
    }
    absl::StrAppend(&layers, stages[s]);
  }
  for (const auto& [letter, what] : {std::pair{'E', "embedding"}, std::pair{'L', "loss"}}) {
    const auto n = std::count(layers.begin(), layers.end(), letter);
    if (n != 1) {
      return fail(absl::StrCat("names the ", what, " '", std::string(1, letter), "' ", n,
                               " times; it needs it once"));
    }
  }
  if (layers.front() != 'E') return fail("must start with the embedding 'E'");
  if (layers.back() != 'L') return fail("must end with the loss 'L'");
  const int num_layers = static_cast<int>(layers.size());
  if (num_layers_expected >= 0 && num_layers != num_layers_expected) {
    return fail(absl::StrCat("has ", num_layers - 2,
                             " transformer layers ('t'); the model has ",
                             std::max(num_layers_expected - 2, 0), " blocks between its embedding and head"));
  }
  core::Boundaries b = {0};
  for (absl::string_view stage : stages) {
    b.push_back(b.back() + static_cast<int>(stage.size()));
  }
  return b;
}

}  // namespace dynmo::formats
