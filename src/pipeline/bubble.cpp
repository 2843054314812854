#include "dstrain/pipeline/bubble.h"

#include <algorithm>

namespace dstrain {

double pipeline_bubble(const std::vector<StageWaits>& stages) {
  double longest = 0;
  for (const StageWaits& s : stages) longest = std::max(longest, s.span);
  if (longest <= 0) return 0.0;
  double idle = 0;
  for (const StageWaits& s : stages) idle += s.waited + (longest - s.span);
  return std::clamp(idle / (static_cast<double>(stages.size()) * longest), 0.0, 1.0);
}

}  // namespace dstrain
