// The run report: SVG line charts (ticks and grid on both axes, the loss on a
// log axis, noisy per-step curves faint under a moving average, values on
// hover), the preflight verdict, the drafts, the config.
#include "train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "core/text.h"

namespace dflash::train {
namespace fs = std::filesystem;
namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
  bool smooth = false;  // noisy per-step values: drawn faint, under their moving average
};

// About `n` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int n = 5) {
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag, step = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

// Ticks of a log10 axis over [lo, hi] (exponents): the decades, and 2 and 5
// times them when the range spans fewer than three decades.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;  // exponents
  const bool fine = hi - lo < 3;
  for (double d = std::floor(lo); d <= std::ceil(hi); d += 1)
    for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double e = d + std::log10(m);
      if (e >= lo - 1e-9 && e <= hi + 1e-9) t.push_back(e);
    }
  return t;
}

// The moving average of the last `w` points (w: about a twentieth of the run).
std::vector<std::pair<double, double>> smoothed(const std::vector<std::pair<double, double>>& p) {
  const size_t w = std::max<size_t>(1, p.size() / 20);
  std::vector<std::pair<double, double>> out;
  double sum = 0;
  size_t n = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (std::isfinite(p[i].second)) sum += p[i].second, ++n;
    if (i >= w && std::isfinite(p[i - w].second)) sum -= p[i - w].second, --n;
    if (n > 0) out.emplace_back(p[i].first, sum / double(n));
  }
  return out;
}

struct Frame {  // data -> pixels
  double x0, x1, y0, y1;
  bool log_y;
  static constexpr double W = 640, H = 260, L = 64, R = 150, T = 20, B = 34;
  double px(double x) const { return L + (x - x0) / (x1 - x0) * (W - L - R); }
  double py(double y) const {  // y already log10 on a log axis
    return H - B - (y - y0) / (y1 - y0) * (H - T - B);
  }
  double ty(double v) const { return log_y ? std::log10(v) : v; }
};

// Axis ticks with values and light grid lines, both axes.
std::string axes(const Frame& f) {
  std::ostringstream o;
  o << fmt::format("<g class=\"y-ticks\" data-scale=\"{}\">", f.log_y ? "log" : "linear");
  for (double t : f.log_y ? log_ticks(f.y0, f.y1) : nice_ticks(f.y0, f.y1)) {
    const double y = f.py(t);
    o << fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>",
                     Frame::L, Frame::W - Frame::R, y, y)
      << fmt::format("<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.4g}</text>",
                     Frame::L - 4, y + 4, f.log_y ? std::pow(10.0, t) : t);
  }
  o << "</g>\n<g class=\"x-ticks\">";
  for (double t : nice_ticks(f.x0, f.x1)) {
    const double x = f.px(t);
    o << fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"#e5e5e5\"/>",
                     x, x, Frame::T, Frame::H - Frame::B)
      << fmt::format(
             "<text class=\"tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>", x,
             Frame::H - Frame::B + 14, t);
  }
  o << fmt::format("</g>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
                   (Frame::L + Frame::W - Frame::R) / 2, Frame::H - 4);
  return o.str();
}

// One series: its line (faint under the moving average when noisy), its
// legend entry, and a hover target with the value on every point.
std::string series_svg(const Frame& f, const Series& s, size_t i) {
  std::ostringstream o;
  auto line = [&](const std::vector<std::pair<double, double>>& pts, const char* extra) {
    std::string p;
    for (auto [x, y] : pts)
      if (std::isfinite(y) && (!f.log_y || y > 0))
        p += fmt::format("{:.1f},{:.1f} ", f.px(x), f.py(f.ty(y)));
    return fmt::format("<polyline fill=\"none\" stroke=\"{}\" {} points=\"{}\"/>\n", s.color, extra,
                       p);
  };
  o << line(s.points,
            s.smooth ? "stroke-width=\"1\" stroke-opacity=\"0.25\"" : "stroke-width=\"1.5\"");
  if (s.smooth) o << line(smoothed(s.points), "stroke-width=\"2\" class=\"smoothed\"");
  o << "<g class=\"hover\">";
  for (auto [x, y] : s.points)
    if (std::isfinite(y) && (!f.log_y || y > 0))
      o << fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\" fill-opacity=\"{}\">"
          "<title>{}: step {:g}, {:.6g}</title></circle>",
          f.px(x), f.py(f.ty(y)), s.points.size() == 1 ? 3 : 2.5, s.color,
          s.points.size() == 1 ? 1 : 0, xml_escape(s.name), x, y);
  o << "</g>\n";
  o << fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}{}</text>\n", Frame::W - Frame::R + 8,
                   Frame::T + 12 + 14 * double(i), s.color, xml_escape(s.name),
                   s.smooth ? " (smoothed)" : "");
  return o.str();
}

// A 640 x 260 chart: ticks and grid on both axes, one line per series,
// values on hover; `log_y` draws the values on a log10 axis.
std::string chart(const std::string& title, const std::vector<Series>& series, bool log_y = false) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points)
      if (std::isfinite(y) && (!log_y || y > 0)) {
        const double v = log_y ? std::log10(y) : y;
        x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, v), y1 = std::max(y1, v);
      }
  if (x0 > x1) return fmt::format("<h3>{}</h3><p>no data</p>\n", xml_escape(title));
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (log_y ? 1 : std::max(1.0, std::abs(y0)) * 0.1), y0 -= y1 - y0;
  const Frame f{x0, x1, y0, y1, log_y};
  std::ostringstream o;
  o << fmt::format(
      "<h3>{}</h3>\n<svg class=\"chart\" width=\"{}\" height=\"{}\" "
      "xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"11\">\n",
      xml_escape(title + (log_y ? " (log scale)" : "")), Frame::W, Frame::H);
  o << axes(f);
  o << fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n",
      Frame::L, Frame::T, Frame::W - Frame::L - Frame::R, Frame::H - Frame::T - Frame::B);
  for (size_t i = 0; i < series.size(); ++i) o << series_svg(f, series[i], i);
  o << "</svg>\n";
  return o.str();
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// A number, or NaN for null / missing / non-numbers (a non-finite value is
// written to JSON as null).
double num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

std::string read_text(const fs::path& p) { return read_file_if_present(p.string()).value_or(""); }

std::vector<nlohmann::json> read_metrics(const fs::path& file) {
  std::ifstream in(file);
  if (!in)
    throw std::runtime_error(
        fmt::format("{}: cannot open (is this a run directory?)", file.string()));
  std::vector<nlohmann::json> rows;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number() ||
        !j.contains("kind"))
      throw std::runtime_error(
          fmt::format("{}:{}: expected a metrics object with kind and step", file.string(), n));
    rows.push_back(std::move(j));
  }
  return rows;
}

std::string verdict_html(const fs::path& file) {
  const std::string text = read_text(file);
  if (text.empty()) return "<p>no preflight verdict recorded</p>\n";
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return "<p>preflight.json is not valid JSON</p>\n";
  if (j.value("skipped", false))
    return "<p style=\"color:#d62728\"><b>preflight SKIPPED</b> (--skip-preflight)</p>\n";
  std::ostringstream o;
  const nlohmann::json passed = j.value("passed", nlohmann::json());
  o << "<p><b>preflight "
    << (passed.is_boolean() ? (passed.get<bool>() ? "passed" : "FAILED") : "verdict unknown")
    << "</b></p>\n"
    << "<table border=\"1\" cellpadding=\"3\" cellspacing=\"0\"><tr><th>check</th><th>result</th>"
       "<th>seconds</th><th>key figure</th></tr>\n";
  for (const auto& c : j.value("checks", nlohmann::json::array()))
    o << fmt::format("<tr><td>{}</td><td>{}</td><td>{:.2f}</td><td>{}</td></tr>\n",
                     xml_escape(c.value("check", "")), xml_escape(c.value("result", "")),
                     num(c, "seconds"), xml_escape(c.value("figure", "")));
  o << "</table>\n";
  return o.str();
}

// Token ids as display text: bytes decoded (byte-tokenized text data), else
// the ids themselves.
// With `visible_space`, blanks and newlines are drawn (a block of spaces is
// otherwise an empty cell).
std::string tokens_html(const nlohmann::json& ids, bool bytes, bool visible_space = false) {
  std::vector<int64_t> v;
  for (const auto& x : ids)
    if (x.is_number_integer()) v.push_back(x.get<int64_t>());
  if (bytes && visible_space) {
    std::string out;
    for (int64_t id : v)
      out += id == ' '    ? "\u2423"  // open box
             : id == '\n' ? "\u21b5"  // return arrow
                          : xml_escape(ByteTokenizer::decode({id}));
    return out;
  }
  if (bytes) return xml_escape(ByteTokenizer::decode(v));
  std::string out;
  for (int64_t id : v) out += fmt::format("{} ", id);
  return out;
}

// The held-out rows the drafter was asked to continue (samples.json, written
// by the run's end): the row's text, then per anchor the drafter's block with
// the accepted prefix highlighted beside what the target wrote.
std::string samples_html(const fs::path& file) {
  const std::string text = read_text(file);
  if (text.empty())
    return "<p>no draft samples recorded (samples.json: written at the end of a run with "
           "held-out data)</p>\n";
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("samples") || !j["samples"].is_array())
    return "<p>samples.json is not valid</p>\n";
  const bool bytes = j.value("tokenizer", "") == "byte";
  const bool by_target = j.value("reference", "target") == "target";
  const char* ref = by_target ? "target wrote" : "dataset's tokens";
  const nlohmann::json none = nlohmann::json::array();
  std::ostringstream o;
  o << "<p>Teacher-forced drafts at the end of the run: at each anchor the drafter proposes the "
       "next tokens in one forward; the prefix that agrees with "
    << (by_target ? "what the target wrote (its own greedy continuation, the training data)"
                  : "the dataset's next tokens (the data's text, not written by the target)")
    << " is accepted, on green, the rest struck through in red"
    << (bytes ? " (\u2423 a space, \u21b5 a newline)" : " (token ids)") << ".</p>\n";
  for (const auto& smp : j["samples"]) {
    o << fmt::format("<div class=\"sample\"><h3>held-out row {}</h3>\n", smp.value("row", -1))
      << "<p class=\"text\"><span class=\"prompt\">"
      << tokens_html(smp.value("prompt", none), bytes) << "</span><span class=\"continuation\">"
      << tokens_html(smp.value("continuation", none), bytes) << "</span></p>\n"
      << "<table class=\"drafts\"><tr><th>anchor</th><th>drafter's block</th><th>" << ref
      << "</th><th>accepted</th></tr>\n";
    for (const auto& b : smp.value("blocks", none)) {
      const nlohmann::json prop = b.value("proposal", none);
      const int64_t acc = b.value("accepted", int64_t(0));
      nlohmann::json head = none, tail = none;
      for (size_t k = 0; k < prop.size(); ++k) (int64_t(k) < acc ? head : tail).push_back(prop[k]);
      o << fmt::format(
          "<tr class=\"block\"><td>{}</td><td class=\"text\"><mark class=\"accepted\">{}</mark>"
          "<span class=\"rejected\">{}</span></td><td class=\"text\">{}</td><td>{} / "
          "{}</td></tr>\n",
          b.value("anchor", int64_t(-1)), tokens_html(head, bytes, true),
          tokens_html(tail, bytes, true), tokens_html(b.value("target", none), bytes, true), acc,
          prop.size());
    }
    o << "</table></div>\n";
  }
  return o.str();
}

}  // namespace

namespace {

// Every curve of the report, from metrics.jsonl's rows.
struct Curves {
  Series loss{"train loss", kColors[0], {}, true}, eloss{"held-out loss", kColors[1], {}};
  Series tau{"train tau", kColors[0], {}, true}, etau{"held-out tau", kColors[1], {}};
  Series lr{"learning rate", kColors[2], {}}, grad{"gradient norm", kColors[3], {}, true};
  Series tps{"tokens/s", kColors[4], {}, true};
  // Served acceptance (docs/EVAL.md): block and tree speculative decoding.
  Series served{"served acceptance (block)", kColors[2], {}},
      stree{"served (tree)", kColors[3], {}};
  std::vector<Series> slots;  // held-out accuracy of slot k = 1, 2, ...
};

Curves read_curves(const std::vector<nlohmann::json>& rows) {
  Curves c;
  std::map<size_t, Series> slots;
  for (const auto& j : rows) {
    const double step = j["step"].get<double>();
    if (j["kind"] == "served") {
      c.served.points.emplace_back(step, num(j, "acceptance"));
      c.stree.points.emplace_back(step, num(j, "tree_acceptance"));
      c.stree.name = fmt::format("served (tree, budget {})", j.value("tree_budget", 0));
      continue;
    }
    const bool eval = j["kind"] == "eval";
    (eval ? c.eloss : c.loss).points.emplace_back(step, num(j, "loss"));
    (eval ? c.etau : c.tau).points.emplace_back(step, num(j, "tau"));
    if (!eval) {
      c.lr.points.emplace_back(step, num(j, "lr"));
      c.grad.points.emplace_back(step, num(j, "grad_norm"));
      c.tps.points.emplace_back(step, num(j, "tokens_per_s"));
      continue;
    }
    const nlohmann::json acc = j.value("accuracy", nlohmann::json::array());
    for (size_t k = 1; acc.is_array() && k < acc.size(); ++k) {
      Series& s = slots[k];
      s.name = fmt::format("slot {}", k), s.color = kColors[(k - 1) % 10];
      s.points.emplace_back(step, acc[k].is_number() ? acc[k].get<double>() : std::nan(""));
    }
  }
  for (auto& [k, s] : slots) c.slots.push_back(s);
  return c;
}

const char* kStyle =
    "<style>.text{white-space:pre-wrap;font-family:monospace}"
    ".prompt{color:#777}.continuation{color:#000}mark.accepted{background:#b6e3b6}"
    ".rejected{color:#8b0000;text-decoration:line-through}"
    "table.drafts td{vertical-align:top;padding:2px 6px}</style>";

}  // namespace

std::string write_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const Curves c = read_curves(read_metrics(dir / "metrics.jsonl"));
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dflash run "
    << xml_escape(run_dir) << "</title>\n"
    << kStyle << "</head>\n<body style=\"font-family:sans-serif;max-width:900px\">\n"
    << "<h1>dflash training run</h1>\n<p>" << xml_escape(fs::absolute(dir).string()) << "</p>\n";
  if (!c.etau.points.empty())
    o << fmt::format("<p>held-out tau: {:.3f} at step {:g} &rarr; {:.3f} at step {:g}</p>\n",
                     c.etau.points.front().second, c.etau.points.front().first,
                     c.etau.points.back().second, c.etau.points.back().first);
  if (!c.served.points.empty())
    o << fmt::format(
        "<p>served acceptance (tokens committed per verification round, block speculative "
        "decoding): {:.3f} "
        "at step {:g} &rarr; {:.3f} at step {:g}; {}: {:.3f}</p>\n",
        c.served.points.front().second, c.served.points.front().first,
        c.served.points.back().second, c.served.points.back().first, c.stree.name,
        c.stree.points.back().second);
  o << "<h2>Preflight</h2>\n" << verdict_html(dir / "preflight.json");
  o << "<h2>Curves</h2>\n"
    << chart("loss", {c.loss, c.eloss}, /*log_y=*/true)
    << chart("tau (expected acceptance length)", {c.tau, c.etau})
    << (c.served.points.empty()
            ? std::string()
            : chart("served acceptance beside held-out tau", {c.etau, c.served, c.stree}))
    << chart("held-out per-slot accuracy (the predicted slots 1..bs-1)", c.slots)
    << chart("learning rate", {c.lr}) << chart("gradient norm (before clipping)", {c.grad})
    << chart("throughput (tokens/s)", {c.tps});
  o << "<h2>Drafts</h2>\n" << samples_html(dir / "samples.json");
  o << "<h2>Config</h2>\n<pre>" << xml_escape(read_text(dir / "config.toml"))
    << "</pre>\n</body></html>\n";
  const std::string out = (dir / "report.html").string();
  safetensors::write_file_atomic(out, o.str());
  return out;
}

}  // namespace dflash::train
