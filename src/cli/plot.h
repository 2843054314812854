// `dstrain plot RUN_DIR...`: PNG charts of runs' metrics.jsonl, drawn by gnuplot.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int plot_command(const std::vector<std::string>& args);

}  // namespace dstrain
