// What `dstrain eval` and `dstrain generate` need of a checkpoint: the configuration it was
// trained with, and its parameters in a model of any layout. Checkpoints store full tensors by
// global name, so a pipeline stage (or the whole model on one process) reads just its own.
#pragma once

#include "dstrain/core/torch_api.h"

#include <map>
#include <string>
#include <vector>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/parallel/parallel_config.h"

namespace dstrain {

// The checkpoint's effective configuration (the INI text of /trainer's `config`) as
// "section.key" → value.
std::map<std::string, std::string> checkpoint_config_values(const std::string& config_text);

// The layout that wrote the checkpoint, from its configuration: parallel.tp, cp, dp, pp, ep and the
// completed order, a key it lacks (a checkpoint from before the key existed) at its default: 1,
// and the order tp-cp-ep-dp-pp. Throws Error(kCheckpoint) for values that make no grid.
ParallelConfig checkpoint_layout(const std::string& config_text);

// The checkpoint's effective configuration as `--section.key=value` arguments of `dstrain train`,
// for the sections that describe the model and its data ([model], [train], [optim], [data]):
// how and where it ran ([run], [parallel], [comm], [ckpt], [log], [debug], train.device and the
// derived train.grad_accum) is left to the defaults and the command line, since evaluation and
// generation choose a layout and a device of their own.
std::vector<std::string> checkpoint_config_arguments(const std::string& config_text);

// Copies the checkpoint's /model/<name> into each parameter (converting to its dtype and device),
// or under tensor parallelism the parameter's block of it (`placement`). Throws Error(kCheckpoint)
// naming the file and the tensor when one is missing or has another shape (a checkpoint of
// another model).
void load_model_parameters(const CheckpointReader& reader, const NamedTensors& params,
                           const TensorParallelPlacement& placement = {});

}  // namespace dstrain
