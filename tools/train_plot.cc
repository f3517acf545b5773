#include "tools/train_plot.h"

#include <algorithm>
#include <cstdio>

namespace zinf::tools {

std::string TrainSvg(const std::vector<double>& loss, const std::vector<double>& tps) {
  const double W = 720, H = 360, pad = 50;
  auto line = [&](const std::vector<double>& v, const char* color) {
    if (v.empty()) return std::string();
    const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
    const double lo = *mn, hi = *mx > *mn ? *mx : *mn + 1;
    std::string pts;
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = pad + (W - 2 * pad) * (v.size() > 1 ? double(i) / (v.size() - 1) : 0);
      const double y = H - pad - (H - 2 * pad) * (v[i] - lo) / (hi - lo);
      pts += std::to_string(x) + "," + std::to_string(y) + " ";
    }
    char label[160];
    std::snprintf(label, sizeof label, "%.3g .. %.3g", lo, hi);
    return "<polyline fill='none' stroke='" + std::string(color) + "' stroke-width='1.5' points='" + pts + "'/>" +
           "<text x='" + std::to_string(W - pad) + "' y='" + (color[0] == 'b' ? "20" : "38") +
           "' text-anchor='end' font-size='12' fill='" + color + "'>" + label + "</text>";
  };
  return "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='360' font-family='sans-serif'>"
         "<rect width='720' height='360' fill='white'/>"
         "<text x='50' y='20' font-size='13'>zinf train: loss (blue) and tokens/s (orange) per step</text>"
         "<line x1='50' y1='310' x2='670' y2='310' stroke='#888'/><line x1='50' y1='50' x2='50' y2='310' "
         "stroke='#888'/>" +
         line(loss, "blue") + line(tps, "orange") + "</svg>\n";
}

}  // namespace zinf::tools
