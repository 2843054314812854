#include "dstrain/pipeline/pipeline_config.h"

#include "dstrain/core/error.h"

namespace dstrain {

void add_pipeline_options(OptionTable& t) {
  t.add("parallel.schedule", OptionKind::kString, "1f1b",
        "pipeline schedule: gpipe, 1f1b, interleaved (1F1B over virtual_stages chunks per stage), or the "
        "zero-bubble zb-h1, zbv and dualpipev (zbv and dualpipev: 2 chunks per stage in a V); every schedule "
        "takes comm.backend = mpi or nccl");
  t.add("parallel.dualpipe_overlap", OptionKind::kBool, "false",
        "dualpipev with expert parallelism: each pair's forward runs on a second thread beside the paired "
        "backward, so that one micro-batch's expert all-to-all waits while the other computes (CPU with the MPI "
        "backend; it pays where ranks have cores to spare; on GPUs the pairs run one after the other)");
  t.add("parallel.virtual_stages", OptionKind::kInt, "0",
        "model chunks per pipeline stage (interleaved: 2 or more; zbv and dualpipev: 2; 0: what the schedule "
        "needs, 2 for interleaved, zbv and dualpipev, 1 for the others)");
  t.add("parallel.stage_layers", OptionKind::kString, "",
        "layers of each virtual stage, e.g. 9,8,8,7 (empty: balanced by FLOPs, the LM head counted)");
}

PipelineConfig read_pipeline_config(Options& o) {
  PipelineConfig c;
  c.schedule = o.get_enum("parallel.schedule", schedule_names());
  c.virtual_stages = static_cast<int>(o.get_int("parallel.virtual_stages", 0, 1024));
  if (c.virtual_stages == 0) {
    c.virtual_stages = default_virtual_stages(c.schedule);
    o.set("parallel.virtual_stages", std::to_string(c.virtual_stages));
  }
  c.dualpipe_overlap = o.get_bool("parallel.dualpipe_overlap");
  const std::string layers = o.get_string("parallel.stage_layers");
  if (!layers.empty() && !parse_integer_list(layers, &c.stage_layers))
    throw config_error("parallel.stage_layers", layers, "expected layer counts separated by commas, e.g. 9,8,8,7");
  return c;
}

}  // namespace dstrain
