// zinf train --plot: the run's loss and tokens/s per step as one SVG.
#pragma once

#include <string>
#include <vector>

namespace zinf::tools {

// Both series scaled to the plot's height, each labelled with its range.
std::string TrainSvg(const std::vector<double>& loss, const std::vector<double>& tps);

}  // namespace zinf::tools
