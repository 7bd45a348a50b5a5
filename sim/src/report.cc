// Reports of simulated runs: a table for the terminal and an SVG for people.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "deltacast/common/svg.h"
#include "deltacast/sim/scenario.h"

namespace deltacast::sim {

std::string render_table(const std::vector<Report>& reports) {
  std::string out;
  char line[640];
  std::snprintf(line, sizeof line, "%-46s %9s %9s %9s %9s %9s %9s %8s %8s %8s %7s %9s %8s %9s %10s %7s\n", "strategy", "p50 s", "p99 s", "max s",
                "bound s", "max/bound", "own p50 s", "p50/own", "p99/own", "max/own", "missed", "WAN GB", "behind", "lag steps", "events", "wall s");
  out += line;
  for (const auto& r : reports) {
    // Averaged over the run: versions behind the newest, and policy lag (time since the held
    // version was published, in training steps).
    double behind = 0, lag = 0;
    for (const auto& s : r.staleness) behind += s.mean_behind, lag += s.mean_lag_steps;
    if (!r.staleness.empty()) behind /= static_cast<double>(r.staleness.size()), lag /= static_cast<double>(r.staleness.size());
    std::snprintf(line, sizeof line, "%-46s %9.2f %9.2f %9.2f %9.2f %9.3f %9.2f %8.3f %8.3f %8.3f %7llu %9.1f %8.3f %9.3f %10llu %7.1f\n", r.name.c_str(),
                  r.p50_s, r.p99_s, r.max_s, r.lower_bound_s, r.lower_bound_s > 0 ? r.max_s / r.lower_bound_s : 0, r.own_bound_p50_s, r.own_p50,
                  r.own_p99, r.own_max, static_cast<unsigned long long>(r.missed),
                  static_cast<double>(r.wan_bytes) / 1e9, behind, lag, static_cast<unsigned long long>(r.events), r.wall_s);
    out += line;
  }
  return out;
}

namespace {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

// One line chart; x may be logarithmic.
void chart(SvgDocument& svg, double x0, double y0, double w, double h, const std::string& title, const std::string& xlabel, const std::string& ylabel,
           const std::vector<Series>& series, bool log_x) {
  double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      if (log_x && x <= 0) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
    }
  if (!(xmax > xmin)) xmin = 0, xmax = 1;
  // Linear axes end on a round number and tick at 1, 2 or 5 times a power of ten.
  auto nice_step = [](double range) {
    const double raw = range / 5, p = std::pow(10, std::floor(std::log10(raw)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
  };
  double xstep = 0, ystep = 0;
  if (log_x) {
    xmin = std::pow(10, std::floor(std::log10(xmin)));
    xmax = std::pow(10, std::ceil(std::log10(xmax)));
  } else {
    xmin = 0;
    xstep = nice_step(xmax);
    xmax = std::ceil(xmax / xstep) * xstep;
  }
  ymax = ymax > 0 ? ymax : 1;
  ystep = nice_step(ymax);
  ymax = std::ceil(ymax * 1.02 / ystep) * ystep;
  auto px = [&](double x) { return x0 + w * (log_x ? (std::log10(x) - std::log10(xmin)) / (std::log10(xmax) - std::log10(xmin)) : (x - xmin) / (xmax - xmin)); };
  auto py = [&](double y) { return y0 + h - h * y / ymax; };
  svg.text(x0, y0 - 10, title, "font-size=\"13\"");
  svg.rect(x0, y0, w, h, "fill=\"none\" stroke=\"#bbb\"");
  // Ticks.
  std::vector<double> xt;
  if (log_x)
    for (double t = xmin; t <= xmax * 1.001; t *= 10) xt.push_back(t);
  else
    for (double t = 0; t <= xmax * 1.0001; t += xstep) xt.push_back(t);
  char label[32];
  for (double t : xt) {
    svg.line(px(t), y0, px(t), y0 + h, "stroke=\"#eee\"");
    std::snprintf(label, sizeof label, "%g", t);
    svg.text(px(t), y0 + h + 15, label, "text-anchor=\"middle\"");
  }
  for (double t = 0; t <= ymax * 1.0001; t += ystep) {
    svg.line(x0, py(t), x0 + w, py(t), "stroke=\"#eee\"");
    std::snprintf(label, sizeof label, "%.3g", t);
    svg.text(x0 - 5, py(t) + 4, label, "text-anchor=\"end\"");
  }
  svg.text(x0 + w / 2, y0 + h + 32, xlabel, "text-anchor=\"middle\"");
  char rotate[96];
  std::snprintf(rotate, sizeof rotate, "text-anchor=\"middle\" transform=\"rotate(-90 %.0f %.0f)\"", x0 - 45, y0 + h / 2);
  svg.text(x0 - 45, y0 + h / 2, ylabel, rotate);
  for (std::size_t k = 0; k < series.size(); ++k) {
    std::vector<std::pair<double, double>> pts;
    for (auto [x, y] : series[k].points)
      if (!log_x || x > 0) pts.emplace_back(px(x), py(y));
    svg.polyline(pts, std::string("fill=\"none\" stroke-width=\"1.8\" stroke=\"") + svg_color(k) + "\"");
  }
}

// The fraction of (version, worker) pairs at or below each value; pairs never ready count in the
// total but never arrive.
Series cdf_of(const std::string& label, std::vector<double> values, std::uint64_t missed) {
  Series c{label, {}};
  std::sort(values.begin(), values.end());
  const double total = static_cast<double>(values.size() + missed);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i + 1 < values.size() && values.size() > 400 && i % (values.size() / 400) != 0) continue;  // thin large runs
    c.points.emplace_back(values[i], static_cast<double>(i + 1) / total);
  }
  return c;
}

}  // namespace

std::string render_svg(const std::string& title, const std::vector<Report>& reports) {
  const double width = 1100, chart_w = 760, chart_h = 260, left = 80;
  std::vector<Series> cdf, stale, own;
  for (const auto& r : reports) {
    cdf.push_back(cdf_of(r.name, r.ready_s, r.missed));
    own.push_back(cdf_of(r.name, r.over_own_bound, r.missed));
    Series s{r.name, {}};
    for (const auto& p : r.staleness) s.points.emplace_back(p.t_s, p.mean_behind);
    stale.push_back(std::move(s));
  }
  double lo = INFINITY, hi = 0;
  for (const auto& r : reports)
    for (double t : r.ready_s) lo = std::min(lo, t), hi = std::max(hi, t);
  const bool log_x = hi > 0 && lo > 0 && hi / lo > 20;
  double own_hi = 0;
  for (const auto& r : reports)
    for (double x : r.over_own_bound) own_hi = std::max(own_hi, x);
  const double height = 60 + 3 * (chart_h + 80) + 20 * static_cast<double>(reports.size()) + 20;
  SvgDocument svg(11);
  svg.text(left, 24, title, "font-size=\"15\"");
  chart(svg, left, 60, chart_w, chart_h, "Publish to ready: fraction of (version, worker) pairs ready within t", "seconds after publish", "fraction", cdf, log_x);
  chart(svg, left, 60 + chart_h + 80, chart_w, chart_h, "Fleet staleness: mean versions behind the newest published", "simulated time, s", "versions behind",
        stale, false);
  chart(svg, left, 60 + 2 * (chart_h + 80), chart_w, chart_h,
        "Each worker against its own bound: fraction of (version, worker) pairs within x times it", "publish to ready / the worker's own bound",
        "fraction", own, own_hi > 20);
  double ly = 60 + 3 * (chart_h + 80);
  for (std::size_t k = 0; k < reports.size(); ++k) {
    const Report& r = reports[k];
    char what[224];
    if (r.ready_s.empty()) std::snprintf(what, sizeof what, "no version ready within the run");
    else std::snprintf(what, sizeof what, "slowest %.2f s, %.2fx the lower bound; a worker at most %.2fx its own%s", r.max_s,
                       r.lower_bound_s > 0 ? r.max_s / r.lower_bound_s : 0, r.own_max, r.missed ? "; some versions never ready" : "");
    svg.rect(left, ly - 4, 14, 4, std::string("fill=\"") + svg_color(k) + "\"");
    svg.text(left + 20, ly, r.name + " (" + what + ")");
    ly += 20;
  }
  return svg.finish(width, height);
}

}  // namespace deltacast::sim
