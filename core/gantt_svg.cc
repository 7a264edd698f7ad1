// RenderGanttSvg: draws a SimResult as a standalone SVG Gantt chart, the
// picture a pipeline-schedule paper would print: one row per stage, ops as
// boxes coloured by pass, time running left to right.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/pipeline_sim.h"

namespace dynmo::core {
namespace {

// Layout in SVG user units (pixels at 100% zoom).
constexpr double kLabelWidth = 80;   // left column with "stage s"
constexpr double kChartWidth = 960;  // the time span [0, T]
constexpr double kRightMargin = 30;  // room for the last tick label
constexpr double kTitleHeight = 36;
constexpr double kRowHeight = 28;
constexpr double kBoxInset = 3;  // gap between a box and its row's edges
constexpr double kAxisHeight = 36;
constexpr double kLegendHeight = 28;
constexpr int kTargetTicks = 8;

// The fixed-point helper stays on snprintf so dynmo_core needs no
// absl::str_format dependency just for the chart.
std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string Short(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// Sub-second iterations read better in milliseconds.
struct TimeUnit {
  double per_second;
  const char* name;
};
TimeUnit UnitFor(double span_s) {
  return span_s < 1 ? TimeUnit{1e3, "ms"} : TimeUnit{1, "s"};
}

std::string FormatTime(double t_s, TimeUnit unit) {
  return absl::StrCat(Short(t_s * unit.per_second), " ", unit.name);
}

// Returns a 1-2-5 tick step giving about kTargetTicks ticks over `span`.
double TickStep(double span) {
  const double raw = span / kTargetTicks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

const char* PassColor(OpKind kind) {
  switch (kind) {
    case OpKind::kForward: return "#4e79a7";
    case OpKind::kBackward: return "#f28e2b";
    case OpKind::kWeightGrad: return "#59a14f";
  }
  return "#999999";
}

const char* PassLetter(OpKind kind) {
  switch (kind) {
    case OpKind::kForward: return "F";
    case OpKind::kBackward: return "B";
    case OpKind::kWeightGrad: return "W";
  }
  return "?";
}

int NumRows(const SimResult& result) {
  int rows = static_cast<int>(result.stage_busy_s.size());
  for (const SimOp& op : result.timeline) rows = std::max(rows, op.stage + 1);
  return rows;
}

void AppendRows(int rows, std::string* svg) {
  for (int s = 0; s < rows; ++s) {
    const double y = kTitleHeight + s * kRowHeight;
    absl::StrAppend(svg, "<rect class=\"row\" x=\"", Fixed(kLabelWidth, 1),
                    "\" y=\"", Fixed(y, 1), "\" width=\"",
                    Fixed(kChartWidth, 1), "\" height=\"",
                    Fixed(kRowHeight, 1), "\" fill=\"",
                    s % 2 == 0 ? "#f4f4f4" : "#e9e9e9", "\"/>\n");
    absl::StrAppend(svg, "<text x=\"8\" y=\"", Fixed(y + kRowHeight / 2 + 4, 1),
                    "\">stage ", s, "</text>\n");
  }
}

// One box per op; the micro-batch number is printed only where it fits, and
// every box carries a tooltip with its exact times.
void AppendOps(const SimResult& result, double px_per_s, TimeUnit unit,
               std::string* svg) {
  for (const SimOp& op : result.timeline) {
    const double x = kLabelWidth + op.start_s * px_per_s;
    const double w = (op.end_s - op.start_s) * px_per_s;
    const double y = kTitleHeight + op.stage * kRowHeight + kBoxInset;
    const double h = kRowHeight - 2 * kBoxInset;
    absl::StrAppend(svg, "<rect class=\"op\" x=\"", Fixed(x, 2), "\" y=\"",
                    Fixed(y, 1), "\" width=\"", Fixed(w, 2), "\" height=\"",
                    Fixed(h, 1), "\" fill=\"", PassColor(op.kind),
                    "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>",
                    PassLetter(op.kind), " micro-batch ", op.microbatch,
                    " on stage ", op.stage, ": ", FormatTime(op.start_s, unit),
                    " to ", FormatTime(op.end_s, unit), "</title></rect>\n");
    const std::string label = absl::StrCat(op.microbatch);
    if (w >= 7.0 * label.size() + 4) {
      absl::StrAppend(svg, "<text x=\"", Fixed(x + w / 2, 2), "\" y=\"",
                      Fixed(y + h / 2 + 4, 1),
                      "\" text-anchor=\"middle\" fill=\"#ffffff\">", label,
                      "</text>\n");
    }
  }
}

void AppendAxis(double span_s, double axis_y, double px_per_s, TimeUnit unit,
                std::string* svg) {
  absl::StrAppend(svg, "<line x1=\"", Fixed(kLabelWidth, 1), "\" y1=\"",
                  Fixed(axis_y, 1), "\" x2=\"",
                  Fixed(kLabelWidth + kChartWidth, 1), "\" y2=\"",
                  Fixed(axis_y, 1), "\" stroke=\"#333333\"/>\n");
  const double step = span_s > 0 ? TickStep(span_s) : 1;
  // The small slack keeps the tick at T when T is a multiple of the step.
  for (int i = 0; i * step <= span_s * (1 + 1e-9); ++i) {
    const double t = i * step;
    const double x = kLabelWidth + t * px_per_s;
    absl::StrAppend(svg, "<line x1=\"", Fixed(x, 2), "\" y1=\"",
                    Fixed(axis_y, 1), "\" x2=\"", Fixed(x, 2), "\" y2=\"",
                    Fixed(axis_y + 5, 1), "\" stroke=\"#333333\"/>\n");
    absl::StrAppend(svg, "<text x=\"", Fixed(x, 2), "\" y=\"",
                    Fixed(axis_y + 18, 1), "\" text-anchor=\"middle\">",
                    FormatTime(t, unit), "</text>\n");
  }
}

void AppendLegend(double legend_y, std::string* svg) {
  struct Entry {
    OpKind kind;
    const char* text;
  };
  const Entry entries[] = {
      {OpKind::kForward, "F forward"},
      {OpKind::kBackward, "B backward (includes W unless split)"},
      {OpKind::kWeightGrad, "W weight gradient"},
  };
  double x = kLabelWidth;
  for (const Entry& e : entries) {
    absl::StrAppend(svg, "<rect class=\"legend\" x=\"", Fixed(x, 1),
                    "\" y=\"", Fixed(legend_y, 1),
                    "\" width=\"14\" height=\"14\" fill=\"",
                    PassColor(e.kind), "\"/>\n");
    absl::StrAppend(svg, "<text x=\"", Fixed(x + 20, 1), "\" y=\"",
                    Fixed(legend_y + 11, 1), "\">", e.text, "</text>\n");
    x += 60 + 6.5 * std::string(e.text).size();
  }
}

}  // namespace

std::string RenderGanttSvg(const SimResult& result, absl::string_view title) {
  const int rows = NumRows(result);
  const double span_s = result.iteration_time_s;
  const double px_per_s = span_s > 0 ? kChartWidth / span_s : 0;
  const TimeUnit unit = UnitFor(span_s);
  const double axis_y = kTitleHeight + rows * kRowHeight + 4;
  const double legend_y = axis_y + kAxisHeight;
  const double width = kLabelWidth + kChartWidth + kRightMargin;
  const double height = legend_y + kLegendHeight;

  const std::string heading = absl::StrCat(
      XmlEscape(title), " (iteration ", FormatTime(span_s, unit), ", bubble ",
      Fixed(100 * result.bubble_ratio, 1), "%)");
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                  Fixed(width, 0), "\" height=\"", Fixed(height, 0),
                  "\" viewBox=\"0 0 ", Fixed(width, 0), " ", Fixed(height, 0),
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n");
  absl::StrAppend(&svg, "<title>", heading, "</title>\n");
  absl::StrAppend(&svg, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  absl::StrAppend(&svg, "<text x=\"8\" y=\"22\" font-size=\"14\">", heading,
                  "</text>\n");
  AppendRows(rows, &svg);
  AppendOps(result, px_per_s, unit, &svg);
  AppendAxis(span_s, axis_y, px_per_s, unit, &svg);
  AppendLegend(legend_y, &svg);
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace dynmo::core
