#include "deltacast/common/svg.h"

#include <cstdio>

namespace deltacast {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
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

const char* svg_color(std::size_t k) {
  static constexpr const char* kColors[] = {"#2f6db5", "#e08a2c", "#4a9d5b", "#b0413e", "#7b5ea7",
                                            "#8c6d31", "#d4669a", "#5f9ea0", "#666666", "#bcbd22"};
  return kColors[k % (sizeof kColors / sizeof *kColors)];
}

void SvgDocument::element(std::string_view open, std::string_view attrs, std::string_view title, std::string_view text) {
  const std::string_view name = open.substr(0, open.find(' '));
  body_ += '<';
  body_ += open;
  if (!attrs.empty()) {
    body_ += ' ';
    body_ += attrs;
  }
  if (title.empty() && text.empty()) {
    body_ += "/>\n";
    return;
  }
  body_ += '>';
  if (!title.empty()) body_ += "<title>" + xml_escape(title) + "</title>";
  body_ += xml_escape(text);
  body_ += "</";
  body_ += name;
  body_ += ">\n";
}

void SvgDocument::text(double x, double y, std::string_view text, std::string_view attrs) {
  element("text x=\"" + num(x) + "\" y=\"" + num(y) + "\"", attrs, {}, text);
}

void SvgDocument::line(double x1, double y1, double x2, double y2, std::string_view attrs) {
  element("line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\"", attrs, {});
}

void SvgDocument::rect(double x, double y, double width, double height, std::string_view attrs, std::string_view title) {
  element("rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(width) + "\" height=\"" + num(height) + "\"", attrs, title);
}

void SvgDocument::circle(double cx, double cy, double r, std::string_view attrs, std::string_view title) {
  element("circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"" + num(r) + "\"", attrs, title);
}

void SvgDocument::polyline(std::span<const std::pair<double, double>> points, std::string_view attrs) {
  std::string pts;
  for (const auto& [x, y] : points) pts += num(x) + "," + num(y) + " ";
  if (!pts.empty()) pts.pop_back();
  element("polyline points=\"" + pts + "\"", attrs, {});
}

void SvgDocument::begin_group(std::string_view attrs) {
  body_ += "<g ";
  body_ += attrs;
  body_ += ">\n";
}

void SvgDocument::end_group() { body_ += "</g>\n"; }

std::string SvgDocument::finish(double width, double height) const {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
         "\" font-family=\"sans-serif\" font-size=\"" + num(font_size_) + "\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body_ +
         "</svg>\n";
}

}  // namespace deltacast
