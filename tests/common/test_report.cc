#include <catch2/catch.hpp>

#include <string>

#include "deltacast/common/stats.h"
#include "deltacast/common/svg.h"

using namespace deltacast;

TEST_CASE("medians and nearest-rank quantiles", "[common][stats]") {
  CHECK(median({}) == 0);
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == 2.5);
  const std::vector<double> v = {5, 1, 4, 2, 3, 6, 8, 7, 10, 9};
  CHECK(quantile(v, 0) == 1);
  CHECK(quantile(v, 0.5) == 5);
  CHECK(quantile(v, 0.99) == 10);
  CHECK(quantile(v, 1) == 10);
  CHECK(quantile({}, 0.5) == 0);
}

TEST_CASE("the SVG writer escapes text and titles and sizes the document when finished", "[common][svg]") {
  CHECK(xml_escape(R"(a<b & "c" > 'd')") == "a&lt;b &amp; &quot;c&quot; &gt; &apos;d&apos;");
  SvgDocument svg(11);
  svg.text(10, 20.25, "p99 <= 2 s & more", "font-size=\"13\"");
  svg.rect(1, 2, 3, 4, "fill=\"red\"", "eu-west.w<7>");
  svg.line(0, 0, 1.5, 2);
  const std::vector<std::pair<double, double>> pts = {{0, 1}, {2.5, 3}};
  svg.polyline(pts, "fill=\"none\"");
  const std::string doc = svg.finish(100, 50.5);
  CHECK(doc.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50.5\" font-family=\"sans-serif\" font-size=\"11\">", 0) == 0);
  CHECK(doc.find("<text x=\"10\" y=\"20.2\" font-size=\"13\">p99 &lt;= 2 s &amp; more</text>") != std::string::npos);
  CHECK(doc.find("<rect x=\"1\" y=\"2\" width=\"3\" height=\"4\" fill=\"red\"><title>eu-west.w&lt;7&gt;</title></rect>") != std::string::npos);
  CHECK(doc.find("<line x1=\"0\" y1=\"0\" x2=\"1.5\" y2=\"2\"/>") != std::string::npos);
  CHECK(doc.find("<polyline points=\"0,1 2.5,3\" fill=\"none\"/>") != std::string::npos);
  CHECK(doc.size() > 20);
  CHECK(doc.compare(doc.size() - 7, 7, "</svg>\n") == 0);
  CHECK(std::string(svg_color(0)) == svg_color(10));
}
