// The fields the training loop's components add to each record of the step report
// (report/step_report.h): what they measured in the interval, reduced over the ranks. Each is a
// field source, called at every log step on every rank in the same order (they are collective).
#pragma once

#include "dstrain/optim/moe_balancing.h"
#include "dstrain/parallel/expert_all_to_all.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/model/context_parallel.h"
#include "dstrain/report/step_report.h"
#include "dstrain/train/model_gradients.h"

namespace dstrain {

// The share of the steps' time each stage's device waited for its neighbours, averaged over
// every rank: the pipeline's bubble as it happened (collective over the world).
StepReport::FieldSource pipeline_bubble_field(PipelineExecutor& executor, ParallelContext& parallel);
// This stage's MoE layers: max/mean of the tokens their experts received in the last step, and
// under expert parallelism the same for the expert-parallel ranks and the ranks a token reached.
StepReport::FieldSource expert_balance_field(const MoeBalancing& balancing);
// Context parallelism: "cp_ring_bytes", the bytes a rank passed around the cp ring a step in the
// interval (its keys and values, or MLA's latents, and their gradients back; an evaluation's
// passes count in the interval it ran in).
StepReport::FieldSource context_parallel_ring_field(const ContextParallelGroup& ring, ParallelContext& parallel,
                                                    int64_t start_step);
// Expert parallelism: the share of the interval's time spent exchanging tokens (dispatch and
// combine, forward and backward, waits for peers included), averaged over every rank (collective);
// with DualPipeV's pairs side by side, the share of that time the other lane's computation hid.
// `start_step`: the step the run continues after.
StepReport::FieldSource expert_exchange_field(ExpertAllToAll& exchange, PipelineExecutor& executor,
                                              ParallelContext& parallel, int64_t start_step);
// The data-parallel gradient reduction, per step of the interval and averaged over every rank
// (collective): the bytes a rank sent, and with `host_clocks` (the MPI backend) the time a bucket
// was under way and the part the step waited for after its backward pass (what overlap did not
// hide).
StepReport::FieldSource data_parallel_comm_field(const ModelGradients& grads, ParallelContext& parallel,
                                                 bool host_clocks);

}  // namespace dstrain
