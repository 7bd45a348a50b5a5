// Minimal SVG charts for reports: horizontal bar charts, one panel per metric.
#pragma once

#include <string>
#include <vector>

namespace deltacast::tools {

struct BarSeries {
  std::string label;          // legend entry
  std::vector<double> values; // one per category
};

struct BarPanel {
  std::string title;                 // "size, % of BF16"
  std::vector<std::string> categories;
  std::vector<BarSeries> series;     // drawn side by side within each category
  std::string value_format = "%.2f"; // printf format for the value labels
};

// Renders panels stacked vertically into one SVG document.
std::string render_bar_panels(const std::string& title, const std::vector<BarPanel>& panels);

}  // namespace deltacast::tools
