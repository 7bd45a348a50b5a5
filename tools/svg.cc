#include "svg.h"

#include "deltacast/common/svg.h"

#include <algorithm>
#include <cstdio>

namespace deltacast::tools {
namespace {

constexpr int kWidth = 860;
constexpr int kLabelWidth = 300;
constexpr int kBarHeight = 16;
constexpr int kBarGap = 4;
constexpr int kCategoryGap = 12;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string render_bar_panels(const std::string& title, const std::vector<BarPanel>& panels) {
  SvgDocument svg(12);
  svg.text(10, 20, title, "font-size=\"15\" font-weight=\"bold\"");
  int y = 40;
  for (const auto& p : panels) {
    svg.text(10, y, p.title, "font-weight=\"bold\"");
    y += 10;
    // Legend, on its own line under the title.
    int lx = kLabelWidth;
    if (p.series.size() > 1) {
      for (std::size_t s = 0; s < p.series.size(); ++s) {
        svg.rect(lx, y - 4, 12, 12, std::string("fill=\"") + svg_color(s) + "\"");
        svg.text(lx + 16, y + 6, p.series[s].label);
        lx += 140;
      }
      y += 20;
    }
    double vmax = 0;
    for (const auto& s : p.series)
      for (double v : s.values) vmax = std::max(vmax, v);
    if (vmax <= 0) vmax = 1;
    const double scale = (kWidth - kLabelWidth - 80) / vmax;
    for (std::size_t c = 0; c < p.categories.size(); ++c) {
      const int group_h = static_cast<int>(p.series.size()) * (kBarHeight + kBarGap);
      svg.text(kLabelWidth - 8, y + group_h / 2 + 4, p.categories[c], "text-anchor=\"end\"");
      for (std::size_t s = 0; s < p.series.size(); ++s) {
        const double v = c < p.series[s].values.size() ? p.series[s].values[c] : 0;
        const int w = std::max(1, static_cast<int>(v * scale));
        svg.rect(kLabelWidth, y, w, kBarHeight, std::string("fill=\"") + svg_color(s) + "\"");
        svg.text(kLabelWidth + w + 6, y + kBarHeight - 4, fmt(p.value_format.c_str(), v));
        y += kBarHeight + kBarGap;
      }
      y += kCategoryGap;
    }
    y += 30;
  }
  return svg.finish(kWidth, y);
}

}  // namespace deltacast::tools
