// `dstrain pipeline simulate`: runs a pipeline schedule on paper and prints its bubble, each
// stage's idle time and live activations, and a timeline.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int pipeline_command(const std::vector<std::string>& args);

}  // namespace dstrain
