// dstrain pipeline simulate: a schedule on paper, before spending GPUs on it.
#include "pipeline.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>

#include "dstrain/core/config.h"
#include "dstrain/core/error.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"

namespace po = boost::program_options;

namespace dstrain {

namespace {

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// f(), with the training keys that the schedule's checks name in their errors given as the flags
// of this command, which is what its user typed.
template <typename Function>
auto in_flag_terms(Function f) {
  try {
    return f();
  } catch (const Error& e) {
    std::string text = e.what();
    const std::string aside = " (train.grad_accum is the number of micro-batches)";  // what --microbatches says
    if (const size_t at = text.find(aside); at != std::string::npos) text.erase(at, aside.size());
    for (const auto& [key, flag] : {std::pair<std::string, std::string>{"parallel.schedule", "--schedule"},
                                    {"parallel.virtual_stages", "--virtual-stages"},
                                    {"parallel.pp", "--pp"},
                                    {"train.grad_accum", "--microbatches"}})
      for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + flag.size()))
        text.replace(at, key.size(), flag);
    throw Error(e.code(), text);
  }
}

// What the schedule's paper says, beside what the simulation gives: GPipe's and 1F1B's fraction,
// ZB-H1's and DualPipeV's idle time per stage (F, B, W: a chunk's forward, input gradient and
// weight gradient), under the assumptions the papers make.
void print_published_bubble(ScheduleKind kind, int pp, int m, const SimulationCosts& costs) {
  const double v = kind == ScheduleKind::kZbV || kind == ScheduleKind::kDualPipeV ? 2 : 1;
  const double f = costs.forward / v, w = costs.weight / v, b = costs.backward / v - w;
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      std::printf("published: (p - 1)/(m + p - 1) = %.4f of the step\n", double(pp - 1) / (m + pp - 1));
      break;
    case ScheduleKind::kZbH1:
      std::printf("published (Qi et al. 2024, for W <= F and W <= B, m >= p): (p - 1)(F + B - W) = %.2f idle\n",
                  (pp - 1) * (f + b - w));
      break;
    case ScheduleKind::kZbV:
      // The V's two ends: the later stages wait for the first forwards, the earlier ones for the last backwards.
      std::printf("published (Qi et al. 2024, for F = B = W and m >= 2p - 1): only the pipeline's fill and drain, "
                  "(p - 1)F = %.2f idle on every stage\n",
                  (pp - 1) * f);
      break;
    case ScheduleKind::kDualPipeV:
      std::printf("published (deepseek-ai/DualPipe, with F&B = F + B unoverlapped; exact for F = B): "
                  "(p - 1)(F&B + B - 3W) = %.2f idle on the most idle stage\n",
                  (pp - 1) * ((f + b + w) + (b + w) - 3 * w));
      break;
    default:
      break;
  }
}

}  // namespace

int pipeline_command(const std::vector<std::string>& args) {
  int pp = 0, microbatches = 0, virtual_stages = 0;
  std::string schedule_name_given = "1f1b";
  SimulationCosts costs;
  po::options_description description("dstrain pipeline simulate options");
  description.add_options()("help,h", "this help")(
      "pp", po::value<int>(&pp)->required(), "pipeline stages")(
      "microbatches", po::value<int>(&microbatches)->required(), "micro-batches per step (train.grad_accum)")(
      "schedule", po::value<std::string>(&schedule_name_given)->default_value("1f1b"),
      "gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev")(
      "virtual-stages", po::value<int>(&virtual_stages)->default_value(0),
      "model chunks per stage (interleaved: 2 or more; 2 for zbv and dualpipev; 0: 2 for those three, 1 for the "
      "others)")(
      "forward-cost", po::value<double>(&costs.forward)->default_value(1.0), "time of one micro-batch's forward through a stage")(
      "backward-cost", po::value<double>(&costs.backward)->default_value(2.0), "... and its whole backward")(
      "weight-cost", po::value<double>(&costs.weight)->default_value(1.0),
      "... of which the weights' gradients (W; zb-h1, zbv, dualpipev)")(
      "transfer-cost", po::value<double>(&costs.transfer)->default_value(0.0), "time of one group of point-to-point transfers");
  auto is_help = [](const std::string& arg) { return arg == "--help" || arg == "-h"; };
  const bool help = args.empty() || args[0] != "simulate" || std::find_if(args.begin(), args.end(), is_help) != args.end();
  if (help) {
    std::cout << "usage: dstrain pipeline simulate --pp P --microbatches M [--schedule S] [--virtual-stages V]\n\n"
              << description;
    // Help asked for is an answer; no subcommand, or another, a usage error (as `dstrain` alone).
    return !args.empty() && (args[0] == "simulate" || is_help(args[0])) ? 0 : 2;
  }
  po::variables_map given;
  parse_command_options(std::vector<std::string>(args.begin() + 1, args.end()), description, &given,
                        "pipeline simulate");
  if (pp < 1) throw config_error("--pp", std::to_string(pp), "expected at least 1");
  if (microbatches < 1) throw config_error("--microbatches", std::to_string(microbatches), "expected at least 1");
  if (!(costs.forward > 0)) throw config_error("--forward-cost", format_number(costs.forward), "expected more than 0");
  if (!(costs.backward > 0)) throw config_error("--backward-cost", format_number(costs.backward), "expected more than 0");
  if (!(costs.transfer >= 0)) throw config_error("--transfer-cost", format_number(costs.transfer), "expected at least 0");
  const ScheduleKind kind = in_flag_terms([&] { return schedule_kind_named(schedule_name_given); });
  if (virtual_stages == 0) virtual_stages = default_virtual_stages(kind);
  in_flag_terms([&] { check_schedule(kind, pp, virtual_stages, microbatches); });

  const Schedule schedule = make_schedule(kind, pp, virtual_stages, microbatches);
  // Only the schedules that split the backward pass have a weight-gradient part to cost.
  if (schedule.splits_backward() && (!(costs.weight >= 0) || !(costs.weight < costs.backward)))
    throw config_error("--weight-cost", format_number(costs.weight), "expected at least 0 and less than --backward-cost");
  const SimulationResult r = simulate(schedule, costs);
  if (r.deadlock) throw Error(ExitCode::kInternal, "pipeline simulate: " + r.problem);
  std::printf("%s, %d stages, %d chunk(s) per stage, %d micro-batches; forward %g, backward %g", schedule_name(kind),
              pp, virtual_stages, microbatches, costs.forward, costs.backward);
  if (schedule.splits_backward()) std::printf(" (weights %g)", costs.weight);
  std::printf(", transfer %g\n\n", costs.transfer);
  std::printf("stage      busy      idle   peak live activations\n");
  for (int s = 0; s < pp; ++s)
    std::printf("%5d %9.2f %9.2f   %d\n", s, r.busy[s], r.idle[s], r.peak_live[s]);
  std::printf("\nstep time %.2f; bubble fraction %.4f; most idle stage %.2f\n", r.makespan, r.bubble_fraction,
              *std::max_element(r.idle.begin(), r.idle.end()));
  if (costs.transfer == 0) print_published_bubble(kind, pp, microbatches, costs);
  double resolution = std::min(costs.forward, costs.backward);
  if (schedule.splits_backward() && costs.weight > 0)
    resolution = std::min({costs.forward, costs.backward - costs.weight, costs.weight});
  std::printf("\n%s", render_timeline(r, resolution / virtual_stages).c_str());
  std::printf("(forwards: micro-batch mod 10; backwards: a = 0, b = 1, ...;%s idle: .)\n",
              schedule.splits_backward() ? " weight gradients: A = 0, B = 1, ...;" : "");
  return 0;
}

}  // namespace dstrain
