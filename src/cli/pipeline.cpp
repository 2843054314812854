// dstrain pipeline simulate: a schedule on paper, before spending GPUs on it.
#include "pipeline.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "dstrain/core/config.h"
#include "dstrain/core/error.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"

namespace po = boost::program_options;

namespace dstrain {

int pipeline_command(const std::vector<std::string>& args) {
  int pp = 0, microbatches = 0, virtual_stages = 1;
  std::string schedule_name_given = "1f1b";
  SimulationCosts costs;
  po::options_description description("dstrain pipeline simulate options");
  description.add_options()("help,h", "this help")(
      "pp", po::value<int>(&pp)->required(), "pipeline stages")(
      "microbatches", po::value<int>(&microbatches)->required(), "micro-batches per step (train.grad_accum)")(
      "schedule", po::value<std::string>(&schedule_name_given)->default_value("1f1b"), "gpipe, 1f1b or interleaved")(
      "virtual-stages", po::value<int>(&virtual_stages)->default_value(1), "model chunks per stage (interleaved)")(
      "forward-cost", po::value<double>(&costs.forward)->default_value(1.0), "time of one micro-batch's forward through a stage")(
      "backward-cost", po::value<double>(&costs.backward)->default_value(2.0), "... and its backward")(
      "transfer-cost", po::value<double>(&costs.transfer)->default_value(0.0), "time of one group of point-to-point transfers");
  const bool help = args.empty() || args[0] != "simulate" ||
                    std::find(args.begin(), args.end(), "--help") != args.end();
  if (help) {
    std::cout << "usage: dstrain pipeline simulate --pp P --microbatches M [--schedule S] [--virtual-stages V]\n\n"
              << description;
    return args.empty() || args[0] == "simulate" || args[0] == "--help" ? 0 : 2;
  }
  po::variables_map given;
  parse_command_options(std::vector<std::string>(args.begin() + 1, args.end()), description, &given,
                        "pipeline simulate");
  if (pp < 1) throw config_error("--pp", std::to_string(pp), "expected at least 1");
  if (microbatches < 1) throw config_error("--microbatches", std::to_string(microbatches), "expected at least 1");
  if (!(costs.forward > 0) || !(costs.backward > 0) || costs.transfer < 0)
    throw config_error("--forward-cost/--backward-cost/--transfer-cost", "", "expected positive costs");
  const ScheduleKind kind = schedule_kind_named(schedule_name_given);
  check_schedule(kind, pp, virtual_stages, microbatches);

  const SimulationResult r = simulate(make_schedule(kind, pp, virtual_stages, microbatches), costs);
  if (r.deadlock) throw Error(ExitCode::kInternal, "pipeline simulate: " + r.problem);
  std::printf("%s, %d stages, %d chunk(s) per stage, %d micro-batches; forward %g, backward %g, transfer %g\n\n",
              schedule_name(kind), pp, virtual_stages, microbatches, costs.forward, costs.backward, costs.transfer);
  std::printf("stage      busy      idle   peak live activations\n");
  for (int s = 0; s < pp; ++s)
    std::printf("%5d %9.2f %9.2f   %d\n", s, r.busy[s], r.idle[s], r.peak_live[s]);
  std::printf("\nstep time %.2f; bubble fraction %.4f", r.makespan, r.bubble_fraction);
  if (kind != ScheduleKind::kInterleaved && costs.transfer == 0)
    std::printf(" (theory (p - 1)/(m + p - 1) = %.4f)", double(pp - 1) / (microbatches + pp - 1));
  std::printf("\n\n%s", render_timeline(r, std::min(costs.forward, costs.backward) / virtual_stages).c_str());
  std::printf("(forwards: micro-batch mod 10; backwards: a = 0, b = 1, ...; idle: .)\n");
  return 0;
}

}  // namespace dstrain
