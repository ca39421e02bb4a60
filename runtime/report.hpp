#pragma once
// What the examples and recipes write about a run: metrics.jsonl (one JSON object per
// step, as it happens, so a crash keeps what was done) and report.html, a
// page of SVG charts of chosen metrics per step that any browser opens
// without a network.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace glint {

class RunReport {
public:
  /// metrics.jsonl, continued: starting afresh (resumed_step < 0), or
  /// resuming a run at step `resumed_step` of `phase`, the lines the run
  /// will write again (a fresh start's all, a resume's after that step) are
  /// moved to metrics.abandoned.jsonl, and the rest is kept. Nothing is ever
  /// lost to a kill: the kept lines replace the file in one rename, after
  /// the moved ones are on disk, and each new line is flushed as it is added.
  explicit RunReport(std::string dir, const std::string& phase = "", int resumed_step = -1) : dir_(std::move(dir)) {
    const auto path = dir_ + "/metrics.jsonl";
    std::vector<std::string> kept, replaced;
    {
      std::ifstream old{path};
      for (std::string line; std::getline(old, line);) {
        if (line.empty()) continue;
        int step = 0;
        char ph[64] = {0};
        const bool ours = std::sscanf(line.c_str(), "{\"step\": %d, \"phase\": \"%63[^\"]\"", &step, ph) == 2;
        if (resumed_step >= 0 && ours && (ph != phase || step <= resumed_step)) kept.push_back(line);
        else replaced.push_back(line);
      }
    }
    if (!replaced.empty()) {
      if (!durable_write(dir_ + "/metrics.abandoned.jsonl", replaced, std::ios::app)) return;
      if (!durable_write(path + ".tmp", kept, std::ios::trunc)) return;
      if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) return;
      sync_path(dir_, true);
    }
    jsonl_.open(path, std::ios::app);
    for (const auto& line : kept) rows_.push_back(parse(line));
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
  // Writes `lines` to `path` (appending or truncating) and fsyncs it.
  static bool durable_write(const std::string& path, const std::vector<std::string>& lines, std::ios::openmode mode) {
    {
      std::ofstream out{path, mode};
      for (const auto& l : lines) out << l << '\n';
      out.flush();
      if (!out) return false;
    }
    return sync_path(path, false);
  }
  static bool sync_path(const std::string& path, bool directory) {
    int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::fsync(fd) == 0;
    ::close(fd);
    return ok;
  }

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

}  // namespace glint
