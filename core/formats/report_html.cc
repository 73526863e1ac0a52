#include "core/formats/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/tensor/magnitude_histogram.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

std::string Escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

double Get(const json& j, const char* key, double fallback = NAN) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return fallback;
  return j[key].get<double>();
}

// `format` is one of this file's literal printf formats for a double ("%.3g", "%.1f", ...).
std::string Fmt(double v, const char* format = "%.3g") {
  if (!std::isfinite(v)) return "&ndash;";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, v);
  return buffer;
}

// Blue (small) to red (large) on t in [0, 1].
std::string Color(double t) {
  if (!std::isfinite(t)) return "#ddd";
  t = std::clamp(t, 0.0, 1.0);
  const int r = static_cast<int>(40 + 215 * t), g = static_cast<int>(80 + 100 * (1 - std::fabs(2 * t - 1))),
            b = static_cast<int>(255 - 215 * t);
  return absl::StrFormat("rgb(%d,%d,%d)", r, g, b);
}

// A chart: the title and legend as HTML (they wrap, never cut), the plot as an SVG drawn in a
// width x height box and scaled to the figure's width.
std::string Figure(const char* cls, const std::string& caption, int width, int height,
                   const std::string& body) {
  return absl::StrFormat(
      "<figure class=\"chart %s\"><figcaption>%s</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
      "viewBox=\"0 0 %d %d\" style=\"max-width:%dpx\">%s</svg></figure>",
      cls, caption, width, height, width * 2, body);
}

std::string Swatch(const char* color, const std::string& label) {
  return absl::StrCat("<span class=\"key\"><i style=\"background:", color, "\"></i>", label,
                      "</span>");
}

std::string Heatmap(const json& report, const char* kind) {
  const json& layers = report["kv"]["layers"];
  int heads = 0;
  double lo = INFINITY, hi = 0;
  for (const json& l : layers) {
    heads = std::max<int>(heads, l[kind]["heads"].size());
    for (const json& h : l[kind]["heads"]) {
      const double a = Get(h, "absmax");
      if (a > 0) {
        lo = std::min(lo, a);
        hi = std::max(hi, a);
      }
    }
  }
  const int cell = 22, left = 60, top = 6;
  const int width = left + std::max(heads, 4) * cell + 10;
  const int height = top + static_cast<int>(layers.size()) * cell + 36;
  std::string svg;
  for (size_t li = 0; li < layers.size(); ++li) {
    const json& l = layers[li];
    const int y = top + static_cast<int>(li) * cell;
    absl::StrAppendFormat(&svg, "<text x=\"4\" y=\"%d\" font-size=\"11\">layer %d</text>",
                          y + 15, l["layer"].get<int>());
    for (const json& h : l[kind]["heads"]) {
      const int hi_idx = h["head"].get<int>();
      const double a = Get(h, "absmax");
      const double t = (a > 0 && hi > lo) ? std::log(a / lo) / std::log(hi / lo) : (a > 0 ? 1.0 : NAN);
      const bool outlier = h.value("outlier", false);
      absl::StrAppendFormat(
          &svg,
          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"%s\" "
          "stroke-width=\"%d\"><title>layer %d %s head %d: absmax %s, scale %s, SQNR %s dB</title></rect>",
          left + hi_idx * cell, y, cell - 2, cell - 2, Color(t), outlier ? "#000" : "none",
          outlier ? 3 : 0, l["layer"].get<int>(), kind, hi_idx, Fmt(a), Fmt(Get(h, "scale")),
          Fmt(Get(h, "sqnr_db"), "%.1f"));
    }
  }
  for (int h = 0; h < heads; ++h) {
    absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%d</text>",
                          left + h * cell + 6, height - 20, h);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" font-size=\"11\">head</text>", left,
                        height - 6);
  const std::string caption = absl::StrCat(
      "<b>", kind, " absmax</b> per layer and head, log colour scale from ", Swatch(Color(0).c_str(), Fmt(lo)),
      " to ", Swatch(Color(1).c_str(), Fmt(hi)), "; a black ring marks an outlier head");
  return Figure("heatmap", caption, width, height, svg);
}

std::string SqnrBars(const json& report) {
  const json& layers = report["kv"]["layers"];
  const int bar = 10, gap = 6, left = 40, top = 8, plot = 160;
  const int width = std::max(left + static_cast<int>(layers.size()) * (2 * bar + gap) + 20, 420);
  double top_db = 10;
  for (const json& l : layers) {
    for (const char* k : {"K", "V"}) top_db = std::max(top_db, Get(l[k], "sqnr_db", 0));
  }
  top_db = std::ceil(top_db / 10) * 10;
  std::string svg;
  for (int db = 0; db <= top_db; db += 10) {
    const double y = top + plot - plot * db / top_db;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                          "<text x=\"4\" y=\"%.1f\" font-size=\"10\">%d</text>",
                          left, width, y, y, y + 3, db);
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const int x = left + static_cast<int>(i) * (2 * bar + gap);
    int k = 0;
    for (const char* kind : {"K", "V"}) {
      const double db = Get(layers[i][kind], "sqnr_db");
      const double h = std::isfinite(db) ? plot * std::clamp(db, 0.0, top_db) / top_db : 0;
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\">"
                            "<title>layer %d %s: %s dB</title></rect>",
                            x + k * bar, top + plot - h, bar - 1, h, k ? "#d0752c" : "#3565c8",
                            layers[i]["layer"].get<int>(), kind, Fmt(db, "%.1f"));
      ++k;
    }
    if (layers.size() <= 40 || i % 4 == 0) {
      absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%d</text>", x,
                            top + plot + 14, layers[i]["layer"].get<int>());
    }
  }
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" font-size=\"11\">layer</text>", left,
                        top + plot + 28);
  return Figure("bars", absl::StrCat("<b>FP8 SQNR (dB)</b> per layer under the session's scales: ",
                                     Swatch("#3565c8", "K"), Swatch("#d0752c", "V")),
                width, top + plot + 34, svg);
}

std::string HistogramSvg(const json& w) {
  const json& bins = w["bins"];
  const int width = 480, height = 200, left = 10, bottom = 26, top = 6;
  double xlo = INFINITY, xhi = 0, cmax = 1;
  for (const json& b : bins) {
    if (b[0].get<double>() > 0) xlo = std::min(xlo, b[0].get<double>());
    xhi = std::max(xhi, b[1].get<double>());
    cmax = std::max(cmax, b[2].get<double>());
  }
  if (!std::isfinite(xlo)) xlo = 1e-6;
  xhi = std::max(xhi, Get(w, "max", xhi) * 1.05);
  const double lx0 = std::log2(xlo), lx1 = std::log2(std::max(xhi, xlo * 2));
  auto X = [&](double v) { return left + (width - left - 8) * (std::log2(v) - lx0) / (lx1 - lx0); };
  auto Y = [&](double c) { return top + (height - top - bottom) * (1 - std::log10(1 + c) / std::log10(1 + cmax)); };
  std::string title = absl::StrCat("layer ", w["layer"].get<int>(), " ", w["kind"].get<std::string>(),
                                   w["head"].is_null() ? " (all heads)" : absl::StrCat(" head ", w["head"].get<int>()),
                                   ": SQNR ", Fmt(Get(w, "sqnr_db"), "%.1f"), " dB");
  std::string svg;
  for (const json& b : bins) {
    const double lo = std::max(b[0].get<double>(), xlo), hi = b[1].get<double>();
    const double c = b[2].get<double>();
    absl::StrAppendFormat(&svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#7a8fb8\"/>",
                          X(lo), Y(c), std::max(0.8, X(hi) - X(lo)), Y(0) - Y(c));
  }
  struct Mark {
    const char* name;
    double v;
    const char* color;
  };
  const json& clips = w["clips"];
  for (Mark m : {Mark{"clip (session)", Get(w, "clip"), "#d62728"},
                 Mark{"percentile", Get(clips, "percentile"), "#2ca02c"},
                 Mark{"mse", Get(clips, "mse"), "#9467bd"},
                 Mark{"max", Get(w, "max"), "#444"}}) {
    if (!(m.v > 0)) continue;
    const double x = X(m.v);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" "
                          "stroke-width=\"%s\" stroke-dasharray=\"%s\"><title>%s: %s</title></line>",
                          x, x, top, height - bottom, m.color,
                          std::string(m.name) == "clip (session)" ? "2.5" : "1.2",
                          std::string(m.name) == "clip (session)" ? "none" : "4 2", m.name, Fmt(m.v));
  }
  for (int e = static_cast<int>(std::ceil(lx0)); e <= static_cast<int>(lx1); e += std::max(1, static_cast<int>((lx1 - lx0) / 6))) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">2^%d</text>",
                          std::clamp(X(std::ldexp(1.0, e)), 16.0, width - 16.0), height - bottom + 12, e);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" font-size=\"10\">|x| (log2 axis); count (log axis)</text>",
                        left, height - 2);
  const std::string caption =
      absl::StrCat("<b>", Escape(title), "</b><br>", Swatch("#d62728", "clip point (session)"),
                   Swatch("#2ca02c", "percentile"), Swatch("#9467bd", "mse"), Swatch("#444", "max"));
  return Figure("hist", caption, width, height, svg);
}

// What to deploy and why, from the per-layer SQNR each observer reaches on this session's data.
std::string Summary(const json& r, const std::string& label) {
  std::string out = absl::StrCat("<div class=\"summary\" id=\"deploy-", label,
                                 "\"><h3>Summary: session ",
                                 Escape(r["session"]["id"].get<std::string>()), "</h3>");
  if (r["kv"].is_null()) return out + "<p>KV-cache calibration is off in this session.</p></div>";
  if (!r["has_histograms"].get<bool>()) {
    return out + "<p>This session kept no histograms, so the observers cannot be compared: deploy its "
                 "scales as they are, or calibrate again with <code>--histograms</code>.</p></div>";
  }
  const char* kObservers[] = {"static_minmax", "percentile", "mse"};
  double sum[3] = {0, 0, 0}, worst[3] = {INFINITY, INFINITY, INFINITY};
  int counted[3] = {0, 0, 0}, sides = 0, for_mse = 0, outliers = 0;
  std::string mse_sides;
  for (const json& l : r["kv"]["layers"]) {
    for (const char* kind : {"K", "V"}) {
      const json& side = l[kind];
      for (const json& h : side["heads"]) outliers += h.value("outlier", false) ? 1 : 0;
      if (!side["recommended"].is_string()) continue;
      ++sides;
      if (side["recommended"] == "mse") {
        ++for_mse;
        if (for_mse <= 6) absl::StrAppend(&mse_sides, for_mse > 1 ? ", " : "", "layer ", l["layer"].get<int>(), " ", kind);
      }
      for (int o = 0; o < 3; ++o) {
        const double db = Get(side["sqnr_db_by_observer"], kObservers[o]);
        if (!std::isfinite(db)) continue;
        sum[o] += db;
        worst[o] = std::min(worst[o], db);
        ++counted[o];
      }
    }
  }
  if (sides == 0) return out + "<p>No K/V histogram was observed yet.</p></div>";
  const double gain = Get(r["thresholds"], "recommend_min_gain_db");
  const std::string session_observer = r["session"]["recipe"]["kv_observer"].get<std::string>();
  std::string deploy;
  if (for_mse == 0) {
    deploy = absl::StrCat("Deploy <b>static_minmax</b> (absmax / qmax): mse gains less than ", Fmt(gain, "%g"),
                          " dB on every one of the ", sides, " layer K/V tensors.");
  } else {
    deploy = absl::StrCat("Deploy <b>mse</b> where it gains at least ", Fmt(gain, "%g"), " dB over static_minmax: ",
                          for_mse, " of ", sides, " layer K/V tensors (", mse_sides, for_mse > 6 ? ", &hellip;" : "",
                          "); static_minmax elsewhere.");
  }
  absl::StrAppend(&out, "<p>", deploy, " This session's scales come from <b>", Escape(session_observer),
                  "</b>; ", outliers, " outlier head", outliers == 1 ? "" : "s", ".</p>",
                  "<table class=\"evidence\"><tr><th>observer</th><th>mean SQNR (dB)</th>"
                  "<th>worst layer SQNR (dB)</th></tr>");
  for (int o = 0; o < 3; ++o) {
    absl::StrAppendFormat(&out, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>", kObservers[o],
                          Fmt(counted[o] ? sum[o] / counted[o] : NAN, "%.2f"),
                          Fmt(counted[o] ? worst[o] : NAN, "%.2f"));
  }
  return out + "</table></div>";
}

std::string LayerTable(const json& report) {
  std::string t =
      "<table><tr><th>layer</th><th>kind</th><th>SQNR dB (session)</th><th>clipped</th>"
      "<th>SQNR static_minmax</th><th>SQNR percentile</th><th>SQNR mse</th><th>recommended</th>"
      "<th>outlier heads</th></tr>";
  for (const json& l : report["kv"]["layers"]) {
    for (const char* kind : {"K", "V"}) {
      const json& s = l[kind];
      std::string outliers;
      for (const json& h : s["heads"]) {
        if (h.value("outlier", false)) absl::StrAppend(&outliers, outliers.empty() ? "" : ", ", h["head"].get<int>());
      }
      const json& by = s["sqnr_db_by_observer"];
      absl::StrAppendFormat(&t,
                            "<tr><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                            "<td>%s</td><td>%s</td><td>%s</td></tr>",
                            l["layer"].get<int>(), kind, Fmt(Get(s, "sqnr_db"), "%.2f"),
                            Fmt(Get(s, "fraction_clipped"), "%.2g"),
                            Fmt(Get(by, "static_minmax"), "%.2f"), Fmt(Get(by, "percentile"), "%.2f"),
                            Fmt(Get(by, "mse"), "%.2f"),
                            s["recommended"].is_string() ? s["recommended"].get<std::string>() : "&ndash;",
                            outliers.empty() ? "&ndash;" : outliers);
    }
  }
  return t + "</table>";
}

std::string HeadTable(const json& report) {
  std::string t =
      "<details><summary>every head</summary><table><tr><th>layer</th><th>kind</th><th>head</th>"
      "<th>absmax</th><th>scale</th><th>static_minmax</th><th>percentile</th><th>mse</th>"
      "<th>clipped</th><th>SQNR dB</th></tr>";
  for (const json& l : report["kv"]["layers"]) {
    for (const char* kind : {"K", "V"}) {
      for (const json& h : l[kind]["heads"]) {
        const json& o = h["observers"];
        absl::StrAppendFormat(
            &t, "<tr%s><td>%d</td><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
            h.value("outlier", false) ? " class=\"outlier\"" : "", l["layer"].get<int>(), kind,
            h["head"].get<int>(), Fmt(Get(h, "absmax"), "%.4g"), Fmt(Get(h, "scale"), "%.4g"),
            Fmt(Get(o, "static_minmax"), "%.4g"), Fmt(Get(o, "percentile"), "%.4g"),
            Fmt(Get(o, "mse"), "%.4g"), Fmt(Get(h, "fraction_clipped"), "%.2g"),
            Fmt(Get(h, "sqnr_db"), "%.2f"));
      }
    }
  }
  return t + "</table></details>";
}

std::string Nvfp4Table(const json& report) {
  const json& modules = report["nvfp4"]["modules"];
  if (modules.empty()) return "<p>No NVFP4 module was observed.</p>";
  std::string t =
      "<table><tr><th>module</th><th>fused group</th><th>input amax</th><th>99.99th pct</th>"
      "<th>amax / p99.99</th><th>percentile</th><th>mse</th><th>weight amax</th>"
      "<th>weight range lost (octaves)</th><th>input range lost, ModelOpt (octaves)</th></tr>";
  for (const json& m : modules) {
    const json obs = m.contains("input_observers") ? m["input_observers"] : json::object();
    absl::StrAppendFormat(
        &t, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
        Escape(m["module"].get<std::string>()), Escape(m["fused_group"].get<std::string>()),
        Fmt(Get(m, "input_amax"), "%.4g"), Fmt(Get(m, "input_p99_99"), "%.4g"),
        Fmt(Get(m, "amax_over_p99_99"), "%.3g"), Fmt(Get(obs, "percentile"), "%.4g"),
        Fmt(Get(obs, "mse"), "%.4g"), Fmt(Get(m, "weight_amax"), "%.4g"),
        Fmt(Get(m, "weight_range_lost_octaves"), "%.2f"),
        Fmt(Get(m, "input_range_lost_octaves_modelopt"), "%.2f"));
  }
  return t + "</table>";
}

std::string SessionSection(const json& r, const std::string& label) {
  const json& s = r["session"];
  const json& recipe = s["recipe"];
  std::string out = absl::StrCat(
      "<section class=\"session\" id=\"session-", label, "\"><h2>", label == "a" ? "" : "", "Session ",
      Escape(s["id"].get<std::string>()), s["name"].get<std::string>().empty() ? "" : " (" + Escape(s["name"].get<std::string>()) + ")",
      "</h2><p id=\"summary-", label, "\">", Escape(s["model"]["architecture"].get<std::string>()), ", ",
      s["model"]["num_layers"].get<int>(), " layers, ", s["model"]["num_kv_heads"].get<int>(),
      " KV heads; state ", s["state"].get<std::string>(), "; kv ", recipe["kv"].get<std::string>(),
      ", kv observer <b>", Escape(recipe["kv_observer"].get<std::string>()), "</b>, input observer <b>",
      Escape(recipe["observer"].get<std::string>()), "</b>, ", recipe["fp8_flavor"].get<std::string>(),
      " (qmax ", Fmt(Get(r, "qmax"), "%g"), "); histograms ",
      r["has_histograms"].get<bool>() ? "kept" : "<b>not kept</b>", ".</p>");
  if (!r["kv"].is_null()) {
    absl::StrAppend(&out, "<h3>K and V absmax per layer and head</h3><div class=\"row\" id=\"heatmaps-", label, "\">",
                    Heatmap(r, "K"), Heatmap(r, "V"), "</div>");
    absl::StrAppend(&out, "<h3>SQNR per layer</h3><div id=\"sqnr-", label, "\">", SqnrBars(r), "</div>");
    absl::StrAppend(&out, "<h3>Worst layers: histograms and clip points</h3><div class=\"row\" id=\"histograms-", label, "\">");
    if (r["worst_histograms"].empty()) absl::StrAppend(&out, "<p>No histograms (the recipe kept none).</p>");
    for (const json& w : r["worst_histograms"]) absl::StrAppend(&out, HistogramSvg(w));
    absl::StrAppend(&out, "</div><h3>Layers: SQNR by observer, recommendation, outlier heads</h3><div id=\"layers-", label,
                    "\" class=\"scroll\">", LayerTable(r), HeadTable(r), "</div>");
  }
  absl::StrAppend(&out, "<h3>NVFP4 inputs and fused groups</h3><div id=\"nvfp4-", label, "\" class=\"scroll\">", Nvfp4Table(r), "</div>");
  if (!r["warnings"].empty()) {
    absl::StrAppend(&out, "<h3>Warnings</h3><ul id=\"warnings-", label, "\">");
    for (const json& w : r["warnings"]) {
      absl::StrAppend(&out, "<li><b>", Escape(w["where"].get<std::string>()), "</b>: ",
                      Escape(w["message"].get<std::string>()), "</li>");
    }
    absl::StrAppend(&out, "</ul>");
  }
  return out + "</section>";
}

std::string CompareSection(const json& a, const json& b) {
  std::string t = absl::StrCat(
      "<section id=\"compare\"><h2>Comparison</h2><p>", Escape(a["session"]["id"].get<std::string>()),
      " (A) vs ", Escape(b["session"]["id"].get<std::string>()),
      " (B): SQNR under each session's own scales, and the ratio of their largest scales.</p>"
      "<table><tr><th>layer</th><th>kind</th><th>SQNR A</th><th>SQNR B</th><th>B &minus; A (dB)</th>"
      "<th>max scale B / A</th></tr>");
  if (a["kv"].is_null() || b["kv"].is_null()) return t + "</table><p>KV is off in one of them.</p></section>";
  const json& la = a["kv"]["layers"];
  const json& lb = b["kv"]["layers"];
  for (size_t i = 0; i < std::min(la.size(), lb.size()); ++i) {
    for (const char* kind : {"K", "V"}) {
      auto max_scale = [&](const json& side) {
        double m = 0;
        for (const json& h : side["heads"]) m = std::max(m, Get(h, "scale", 0));
        return m;
      };
      const double sa = Get(la[i][kind], "sqnr_db"), sb = Get(lb[i][kind], "sqnr_db");
      const double ma = max_scale(la[i][kind]), mb = max_scale(lb[i][kind]);
      absl::StrAppendFormat(&t, "<tr><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
                            la[i]["layer"].get<int>(), kind, Fmt(sa, "%.2f"), Fmt(sb, "%.2f"),
                            Fmt(sb - sa, "%+.2f"), Fmt(ma > 0 ? mb / ma : NAN, "%.3f"));
    }
  }
  return t + "</table></section>";
}

// A fleet version's record (reports from GetReport with a fleet): which version, why it was
// published, from what traffic.
std::string VersionSection(const json& r, const std::string& label) {
  const json& v = r["fleet_version"];
  std::string windows;
  for (const json& w : v["windows"]) {
    absl::StrAppend(&windows, windows.empty() ? "" : ", ", Escape(w["session_id"].get<std::string>()),
                    " (", w["tokens"].get<int64_t>(), " K/V tokens)");
  }
  std::string kept;
  for (const json& l : v["kept_layers"]) absl::StrAppend(&kept, kept.empty() ? "" : ", ", l.get<int>());
  const std::string detail = v["detail"].get<std::string>();
  return absl::StrCat(
      "<div class=\"summary\" id=\"version-", label, "\"><h3>Fleet ", Escape(v["fleet"].get<std::string>()),
      ", version ", v["id"].get<int64_t>(), v["current"].get<bool>() ? " (current)" : "", "</h3><p>Weight version <b>",
      Escape(v["weight_version"].get<std::string>()), "</b>; published because <b>",
      Escape(v["reason"].get<std::string>()), "</b>", detail.empty() ? "" : " (" + Escape(detail) + ")",
      "; parent ", v["parent"].get<int64_t>() == 0 ? std::string("none") : absl::StrCat("version ", v["parent"].get<int64_t>()),
      ". Window ", windows.empty() ? "none" : windows, ". ",
      kept.empty() ? std::string("Every layer was seen by its window.")
                   : absl::StrCat("Layers kept from the parent (not in the window, so not in the charts below): ", kept, "."),
      "</p></div>");
}

// Two versions of one fleet: per layer and head, B's published K/V scale over A's, the moves
// beyond the fleet's drift threshold marked.
std::string VersionDiffSection(const json& a, const json& b) {
  const json& va = a["fleet_version"];
  const json& vb = b["fleet_version"];
  const double drift = Get(vb, "drift", 0.05);
  std::string t = absl::StrCat(
      "<section id=\"version-diff\"><h2>Version ", vb["id"].get<int64_t>(), " over version ",
      va["id"].get<int64_t>(), "</h2><p>Per layer and head, the published K/V scale of version ",
      vb["id"].get<int64_t>(), " (weight ", Escape(vb["weight_version"].get<std::string>()), ", ",
      Escape(vb["reason"].get<std::string>()), ") divided by version ", va["id"].get<int64_t>(), "'s (weight ",
      Escape(va["weight_version"].get<std::string>()), ", ", Escape(va["reason"].get<std::string>()),
      "). Marked: a move beyond the fleet's drift of ", Fmt(drift, "%g"), ".</p>");
  if (va["kv_scales"].is_null() || vb["kv_scales"].is_null()) {
    return t + "<p>KV is off in one of them.</p></section>";
  }
  auto kept = [](const json& v, int layer) {
    for (const json& l : v["kept_layers"]) if (l.get<int>() == layer) return true;
    return false;
  };
  absl::StrAppend(&t, "<div class=\"scroll\"><table><tr><th>layer</th><th>kind</th><th>largest move</th>"
                      "<th>B / A per head</th></tr>");
  const json& la = va["kv_scales"];
  const json& lb = vb["kv_scales"];
  int moved = 0;
  for (size_t i = 0; i < std::min(la.size(), lb.size()); ++i) {
    const int layer = la[i]["layer"].get<int>();
    for (const char* kind : {"k_scale", "v_scale"}) {
      const json& sa = la[i][kind];
      const json& sb = lb[i][kind];
      std::string heads;
      double worst = 0;
      for (size_t h = 0; h < std::min(sa.size(), sb.size()); ++h) {
        const double x = sa[h].is_number() ? sa[h].get<double>() : NAN;
        const double y = sb[h].is_number() ? sb[h].get<double>() : NAN;
        const double ratio = x > 0 ? y / x : NAN;
        const double move = ratio > 0 ? std::max(ratio, 1 / ratio) - 1 : INFINITY;
        worst = std::max(worst, move);
        absl::StrAppend(&heads, heads.empty() ? "" : " ", Fmt(ratio, "%.3f"));
      }
      const bool beyond = worst > drift;
      moved += beyond ? 1 : 0;
      absl::StrAppendFormat(&t, "<tr%s><td>%d%s</td><td>%s</td><td>%s</td><td style=\"text-align:left\">%s</td></tr>",
                            beyond ? " class=\"outlier\"" : "", layer,
                            kept(vb, layer) ? " (kept)" : "", kind[0] == 'k' ? "K" : "V",
                            Fmt(100 * worst, "%.2f%%"), heads);
    }
  }
  absl::StrAppend(&t, "</table></div><p>", moved, " of ", 2 * std::min(la.size(), lb.size()),
                  " layer K/V tensors moved beyond the drift threshold.</p></section>");
  return t;
}

// The fields VersionSection and VersionDiffSection read, with their types.
bool ValidVersion(const json& v) {
  if (!v.is_object()) return false;
  for (const char* key : {"fleet", "weight_version", "reason", "detail"}) {
    if (!v.contains(key) || !v[key].is_string()) return false;
  }
  for (const char* key : {"id", "parent"}) {
    if (!v.contains(key) || !v[key].is_number_integer()) return false;
  }
  if (!v.contains("current") || !v["current"].is_boolean()) return false;
  if (!v.contains("windows") || !v["windows"].is_array()) return false;
  for (const json& w : v["windows"]) {
    if (!w.is_object() || !w.contains("session_id") || !w["session_id"].is_string() ||
        !w.contains("tokens") || !w["tokens"].is_number_integer()) {
      return false;
    }
  }
  if (!v.contains("kept_layers") || !v["kept_layers"].is_array()) return false;
  for (const json& l : v["kept_layers"]) if (!l.is_number_integer()) return false;
  if (!v.contains("kv_scales") || !(v["kv_scales"].is_null() || v["kv_scales"].is_array())) {
    return false;
  }
  if (v["kv_scales"].is_array()) {
    for (const json& l : v["kv_scales"]) {
      if (!l.is_object() || !l.contains("layer") || !l["layer"].is_number_integer() ||
          !l.contains("k_scale") || !l["k_scale"].is_array() || !l.contains("v_scale") ||
          !l["v_scale"].is_array()) {
        return false;
      }
    }
  }
  return true;
}

absl::StatusOr<std::vector<json>> Parse(const std::vector<std::string>& reports) {
  if (reports.empty() || reports.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("reports: need 1 or 2, got ", reports.size()));
  }
  std::vector<json> out;
  for (size_t i = 0; i < reports.size(); ++i) {
    json j = json::parse(reports[i], nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || j.value("schema", "") != "caliper.report.v1" ||
        !j.contains("session") || !j.contains("kv") || !j.contains("nvfp4")) {
      return absl::InvalidArgumentError(
          absl::StrCat("reports[", i, "]: not a caliper.report.v1 JSON"));
    }
    if (j.contains("fleet_version") && !ValidVersion(j["fleet_version"])) {
      return absl::InvalidArgumentError(
          absl::StrCat("reports[", i, "].fleet_version: not a fleet version record"));
    }
    out.push_back(std::move(j));
  }
  return out;
}

// Charts fill their grid cell (at least 360 px, so a 1280 px laptop screen shows two or three
// side by side); wide tables scroll inside their own box rather than widening the page.
constexpr char kStyle[] =
    "body{font-family:sans-serif;margin:16px auto;max-width:1800px;padding:0 16px;color:#222;"
    "background:#fff;line-height:1.35}"
    "table{border-collapse:collapse;font-size:12px;margin:6px 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f0f0f0}"
    "tr.outlier td{background:#fde2e2}"
    ".row{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:16px}"
    ".pair{display:grid;grid-template-columns:1fr 1fr;gap:24px;align-items:start}"
    ".pair>section{min-width:0}.scroll{overflow-x:auto;max-width:100%}"
    "figure.chart{margin:0;min-width:0}figcaption{font-size:13px;margin:0 0 4px}"
    "figure.chart svg{display:block;width:100%;height:auto;background:#fafafa;border:1px solid #ddd}"
    ".key{white-space:nowrap;margin-right:10px}.key i{display:inline-block;width:10px;height:10px;"
    "margin-right:4px;vertical-align:baseline}"
    ".summary{border:1px solid #9ab;background:#f3f7fb;padding:4px 12px;margin:8px 0;max-width:900px}"
    "h1{font-size:22px}h2{font-size:18px}h3{font-size:15px}";

}  // namespace

absl::StatusOr<std::string> RenderReportHtml(const std::vector<std::string>& reports) {
  absl::StatusOr<std::vector<json>> parsed = Parse(reports);
  if (!parsed.ok()) return parsed.status();
  const std::vector<json>& r = *parsed;
  std::string html = absl::StrCat(
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Caliper quality report</title>"
      "<style>", kStyle, "</style></head><body><h1>Caliper quality report</h1>"
      "<p>FP8 KV-cache and NVFP4 calibration quality from the session's |x| histograms "
      "(", MagnitudeHistogram::kBinsPerOctave, " bins per octave). SQNR = 10 log10(E[x&sup2;] / E[(x &minus; q(x))&sup2;]) with q the FP8 "
      "fake-quantization at the session's scales; an outlier head has an absmax at least ",
      Fmt(Get(r[0]["thresholds"], "outlier_head_ratio"), "%g"),
      "&times; its layer's median; mse is recommended where it gains at least ",
      Fmt(Get(r[0]["thresholds"], "recommend_min_gain_db"), "%g"), " dB over static_minmax.</p>");
  // What to deploy first, then the evidence.
  auto version = [&](const json& report, const std::string& label) {
    return report.contains("fleet_version") ? VersionSection(report, label) : std::string();
  };
  if (r.size() == 2) {
    const bool versions = r[0].contains("fleet_version") && r[1].contains("fleet_version");
    absl::StrAppend(&html, "<div class=\"pair\"><div>", version(r[0], "a"), Summary(r[0], "a"),
                    "</div><div>", version(r[1], "b"), Summary(r[1], "b"), "</div></div>",
                    versions ? VersionDiffSection(r[0], r[1]) : "", CompareSection(r[0], r[1]),
                    "<div class=\"pair\">", SessionSection(r[0], "a"), SessionSection(r[1], "b"),
                    "</div>");
  } else {
    absl::StrAppend(&html, version(r[0], "a"), Summary(r[0], "a"), SessionSection(r[0], "a"));
  }
  return html + "</body></html>\n";
}

absl::StatusOr<std::string> CombineReportJson(const std::vector<std::string>& reports) {
  absl::StatusOr<std::vector<json>> parsed = Parse(reports);
  if (!parsed.ok()) return parsed.status();
  if (parsed->size() == 1) return (*parsed)[0].dump(1) + "\n";
  json out = {{"schema", "caliper.report.compare.v1"}, {"sessions", *parsed}};
  return out.dump(1) + "\n";
}

}  // namespace caliper
