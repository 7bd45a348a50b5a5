#include "svg.h"

#include <algorithm>
#include <cstdio>

namespace deltacast::tools {
namespace {

constexpr const char* kColors[] = {"#2f6db5", "#e08a2c", "#4a9d5b", "#b0413e"};
constexpr int kWidth = 860;
constexpr int kLabelWidth = 300;
constexpr int kBarHeight = 16;
constexpr int kBarGap = 4;
constexpr int kCategoryGap = 12;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string render_bar_panels(const std::string& title, const std::vector<BarPanel>& panels) {
  std::string body;
  int y = 40;
  for (const auto& p : panels) {
    body += "<text x=\"10\" y=\"" + std::to_string(y) + "\" font-weight=\"bold\">" + escape(p.title) + "</text>\n";
    y += 10;
    // Legend, on its own line under the title.
    int lx = kLabelWidth;
    if (p.series.size() > 1) {
      for (std::size_t s = 0; s < p.series.size(); ++s) {
        body += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(y - 4) + "\" width=\"12\" height=\"12\" fill=\"" + kColors[s % 4] + "\"/>";
        body += "<text x=\"" + std::to_string(lx + 16) + "\" y=\"" + std::to_string(y + 6) + "\">" + escape(p.series[s].label) + "</text>\n";
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
      body += "<text x=\"" + std::to_string(kLabelWidth - 8) + "\" y=\"" + std::to_string(y + group_h / 2 + 4) +
              "\" text-anchor=\"end\">" + escape(p.categories[c]) + "</text>\n";
      for (std::size_t s = 0; s < p.series.size(); ++s) {
        const double v = c < p.series[s].values.size() ? p.series[s].values[c] : 0;
        const int w = std::max(1, static_cast<int>(v * scale));
        body += "<rect x=\"" + std::to_string(kLabelWidth) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(w) +
                "\" height=\"" + std::to_string(kBarHeight) + "\" fill=\"" + kColors[s % 4] + "\"/>";
        body += "<text x=\"" + std::to_string(kLabelWidth + w + 6) + "\" y=\"" + std::to_string(y + kBarHeight - 4) + "\">" +
                fmt(p.value_format.c_str(), v) + "</text>\n";
        y += kBarHeight + kBarGap;
      }
      y += kCategoryGap;
    }
    y += 30;
  }
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) + "\" height=\"" + std::to_string(y) +
                    "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" + escape(title) + "</text>\n";
  out += body;
  out += "</svg>\n";
  return out;
}

}  // namespace deltacast::tools
