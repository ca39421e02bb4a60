#pragma once
// What the examples write about a run: metrics.jsonl (one JSON object per
// step, as it happens, so a crash keeps what was done) and report.html, a
// page of SVG charts of chosen metrics per step that any browser opens
// without a network.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace glint::examples {

class Report {
public:
  /// A new metrics.jsonl; or, resuming a run at step `resumed_step` of
  /// `phase`, the old one without the lines after that step (the resumed
  /// run writes them again).
  explicit Report(std::string dir, const std::string& phase = "", int resumed_step = -1) : dir_(std::move(dir)) {
    const auto path = dir_ + "/metrics.jsonl";
    std::vector<std::string> kept;
    if (resumed_step >= 0) {
      std::ifstream old{path};
      for (std::string line; std::getline(old, line);) {
        int step = 0;
        char ph[64] = {0};
        if (std::sscanf(line.c_str(), "{\"step\": %d, \"phase\": \"%63[^\"]\"", &step, ph) == 2 &&
            (ph != phase || step <= resumed_step))
          kept.push_back(line);
      }
    }
    jsonl_.open(path, std::ios::trunc);
    for (const auto& line : kept) {
      jsonl_ << line << '\n';
      rows_.push_back(parse(line));
    }
  }
  bool ok() const { return static_cast<bool>(jsonl_); }

  /// Appends one step: its phase ("sft", "grpo", ...) and numbers.
  void add(int step, const std::string& phase, const std::map<std::string, double>& values) {
    jsonl_ << "{\"step\": " << step << ", \"phase\": \"" << phase << "\"";
    for (const auto& [k, v] : values) {
      jsonl_ << ", \"" << k << "\": ";
      if (std::isfinite(v)) jsonl_ << v;
      else jsonl_ << "null";
    }
    jsonl_ << "}\n";
    jsonl_.flush();
    rows_.push_back({step, phase, values});
  }

  /// Writes report.html: one chart per (phase, metric) asked for. Returns its path.
  std::string write_html(const std::string& title, const std::vector<std::pair<std::string, std::string>>& charts) const {
    auto path = dir_ + "/report.html";
    std::ofstream html{path, std::ios::trunc};
    html << "<!doctype html><html><head><meta charset=\"utf-8\"><title>" << title
         << "</title><style>body{font-family:sans-serif;margin:2em}svg{background:#fafafa;border:1px solid #ddd;"
            "margin:0 1em 1em 0}h2{font-size:1em;margin:.2em 0}.c{display:inline-block}</style></head><body><h1>"
         << title << "</h1>\n";
    for (const auto& [phase, metric] : charts) html << chart(phase, metric);
    html << "<p>Light: each step; dark: the mean of the last 10 steps. Data: metrics.jsonl, one JSON object per "
            "step.</p></body></html>\n";
    return path;
  }

private:
  struct Row {
    int step;
    std::string phase;
    std::map<std::string, double> values;
  };

  // A line this class wrote: {"step": N, "phase": "P", "key": number-or-null, ...}.
  static Row parse(const std::string& line) {
    Row r{0, {}, {}};
    char ph[64] = {0};
    std::sscanf(line.c_str(), "{\"step\": %d, \"phase\": \"%63[^\"]\"", &r.step, ph);
    r.phase = ph;
    size_t at = line.find("\"phase\"");
    at = line.find(',', at);
    while (at != std::string::npos) {
      auto k0 = line.find('"', at), k1 = k0 == std::string::npos ? k0 : line.find('"', k0 + 1);
      if (k1 == std::string::npos) break;
      auto key = line.substr(k0 + 1, k1 - k0 - 1);
      const char* v = line.c_str() + k1 + 3;  // past `": `
      char* end = nullptr;
      double x = std::strtod(v, &end);
      r.values[key] = end != v ? x : NAN;
      at = line.find(',', k1);
    }
    return r;
  }

  std::string chart(const std::string& phase, const std::string& metric) const {
    std::vector<std::pair<double, double>> pts;
    for (const auto& r : rows_)
      if (r.phase == phase)
        if (auto it = r.values.find(metric); it != r.values.end() && std::isfinite(it->second))
          pts.emplace_back(r.step, it->second);
    if (pts.empty()) return {};
    double x0 = pts.front().first, x1 = pts.back().first, y0 = pts.front().second, y1 = y0;
    for (auto [x, y] : pts) {
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1;
    constexpr double w = 480, h = 220, m = 40;
    auto polyline = [&](const std::vector<std::pair<double, double>>& ps) {
      std::string poly;
      for (auto [x, y] : ps) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", m + (x - x0) / (x1 - x0) * (w - 2 * m),
                      h - m - (y - y0) / (y1 - y0) * (h - 2 * m));
        poly += buf;
      }
      return poly;
    };
    // The raw values, and their running mean over 10 steps (the trend).
    std::vector<std::pair<double, double>> smooth;
    double sum = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      sum += pts[i].second - (i >= 10 ? pts[i - 10].second : 0);
      smooth.emplace_back(pts[i].first, sum / static_cast<double>(std::min<size_t>(i + 1, 10)));
    }
    char axis[512];
    std::snprintf(axis, sizeof axis,
                  "<text x=\"%g\" y=\"%g\" font-size=\"11\">%.3g</text><text x=\"4\" y=\"%g\" font-size=\"11\">%.3g</text>"
                  "<text x=\"%g\" y=\"%g\" font-size=\"11\">step %g</text><text x=\"%g\" y=\"%g\" font-size=\"11\" "
                  "text-anchor=\"end\">%g</text>",
                  4.0, m - 4, y1, h - m, y0, m, h - 8, x0, w - m, h - 8, x1);
    return "<div class=\"c\"><h2>" + phase + ": " + metric + "</h2><svg width=\"480\" height=\"220\">" + axis +
           "<polyline fill=\"none\" stroke=\"#9cd\" stroke-width=\"1\" points=\"" + polyline(pts) +
           "\"/><polyline fill=\"none\" stroke=\"#16a\" stroke-width=\"2.5\" points=\"" + polyline(smooth) +
           "\"/></svg></div>\n";
  }

  std::string dir_;
  std::ofstream jsonl_;
  std::vector<Row> rows_;
};

}  // namespace glint::examples
