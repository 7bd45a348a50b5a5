// One SVG writer for every report deltacast draws (the fleet plan, simulator runs, benchmark
// bars): elements are added one by one, text and titles XML-escaped, and the document is sized
// when it is finished (a report knows its height last).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace deltacast {

// &, <, >, " and ' as entities.
std::string xml_escape(std::string_view text);
// The k-th colour of the palette every chart uses (it repeats after 10).
const char* svg_color(std::size_t k);

class SvgDocument {
 public:
  explicit SvgDocument(double font_size = 12) : font_size_(font_size) {}

  // `attrs` are further attributes, written as given (`fill="#999" text-anchor="end"`); the
  // text, and a `title` (a tooltip), are escaped.
  void text(double x, double y, std::string_view text, std::string_view attrs = {});
  void line(double x1, double y1, double x2, double y2, std::string_view attrs = {});
  void rect(double x, double y, double width, double height, std::string_view attrs = {}, std::string_view title = {});
  void circle(double cx, double cy, double r, std::string_view attrs = {}, std::string_view title = {});
  void polyline(std::span<const std::pair<double, double>> points, std::string_view attrs = {});
  void begin_group(std::string_view attrs);
  void end_group();

  // The document: a white background, then the elements in the order they were added.
  std::string finish(double width, double height) const;

 private:
  void element(std::string_view open, std::string_view attrs, std::string_view title, std::string_view text = {});
  double font_size_;
  std::string body_;
};

}  // namespace deltacast

#pragma GCC visibility pop
