// The pipeline's bubble as the log reports it (`pipeline_idle`), from what the stages of one
// pipeline measured over the same steps: the time each waited for its neighbours and the span
// from the start of its step's actions to their end.
//
// The stages start a step together: they leave the previous step's gradient-norm all-reduce at
// once, and what each does before its first action (its share of the optimizer step) is short
// against the pipeline. They end apart: under 1F1B the last stage is done (P − 1) backward passes
// before the first. A stage done early waits for the last one in that all-reduce, outside its
// span, and the simulator counts that wait as idle as it counts any other. So a stage's idle time
// is its waits plus the time from the end of its span to the end of the longest, and the bubble
// is the stages' idle time over the stages' count times the longest span, the simulator's
// definition (simulator.h).
#pragma once

#include <vector>

namespace dstrain {

struct StageWaits {
  double waited = 0;  // seconds spent waiting for other stages' transfers
  double span = 0;    // seconds from the first action to the last
};

// In [0, 1]; 0 for no stages or spans of zero.
double pipeline_bubble(const std::vector<StageWaits>& stages);

}  // namespace dstrain
