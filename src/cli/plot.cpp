// Charts of one run, or of several overlaid for comparison, from their metrics.jsonl: loss and
// eval loss, learning rate, throughput and MFU against the step. gnuplot (Debian's gnuplot-nox,
// pngcairo terminal) draws them; dstrain writes the data and the script it reads.
#include "plot.h"

#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"

namespace dstrain {
namespace {

const char* kPlotUsage =
    "usage: dstrain plot RUN_DIR... [--output DIR] [--width W] [--height H]\n"
    "\n"
    "Writes loss.png (training and evaluation loss), lr.png, throughput.png (tokens/s) and, when the\n"
    "runs recorded it, mfu.png, from each RUN_DIR/metrics.jsonl; several runs are overlaid, each\n"
    "named by its directory. Needs gnuplot (Debian: gnuplot-nox).\n"
    "\n"
    "  --output DIR   where the PNG files go (default: RUN_DIR for one run, plots/ for several)\n"
    "  --width W      image width in pixels (1000)\n"
    "  --height H     image height in pixels (600)\n";

// One chart: which metrics.jsonl keys it draws, and how.
struct Chart {
  std::string file, title, ylabel;
  std::vector<std::pair<std::string, std::string>> series;  // (key, label suffix)
  bool log_scale = false;
};

// A string gnuplot reads inside double quotes.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string run_name(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  return slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
}

// key → (step, value) of every record of a metrics.jsonl that has the key.
std::map<std::string, std::vector<std::pair<int64_t, double>>> read_metrics(const std::string& run_dir) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) throw config_error("RUN_DIR", run_dir, "no metrics.jsonl there (not a dstrain run directory?)");
  std::map<std::string, std::vector<std::pair<int64_t, double>>> series;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw data_error(path + ":" + std::to_string(number) + ": not a metrics record (a JSON object with \"step\")");
    for (const auto& [key, value] : record.items())
      if (key != "step" && value.is_number()) series[key].emplace_back(record["step"].get<int64_t>(), value.get<double>());
  }
  return series;
}

}  // namespace

int plot_command(const std::vector<std::string>& args) {
  std::vector<std::string> runs;
  std::string output;
  int width = 1000, height = 600;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kPlotUsage;
      return 0;
    }
    if (arg == "--output" || arg == "--width" || arg == "--height") {
      if (i + 1 >= args.size()) throw Error(ExitCode::kUsage, "plot: " + arg + " needs a value (see dstrain plot --help)");
      const std::string value = args[++i];
      if (arg == "--output") {
        output = value;
        continue;
      }
      char* end = nullptr;
      const long pixels = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || pixels < 100 || pixels > 10000)
        throw config_error(arg, value, "expected a number of pixels between 100 and 10000");
      (arg == "--width" ? width : height) = static_cast<int>(pixels);
      continue;
    }
    if (arg.rfind("--", 0) == 0) throw Error(ExitCode::kUsage, "plot: unknown option " + arg + " (see dstrain plot --help)");
    runs.push_back(arg);
  }
  if (runs.empty()) throw Error(ExitCode::kUsage, "plot: name at least one run directory (see dstrain plot --help)");
  if (output.empty()) output = runs.size() == 1 ? runs[0] : "plots";
  // Each run's series as data files gnuplot reads: "step value" lines. (Read first: a run that
  // is not there leaves no output directory behind.)
  std::vector<std::map<std::string, std::vector<std::pair<int64_t, double>>>> metrics;
  for (const std::string& run : runs) metrics.push_back(read_metrics(run));
  std::string why;
  if (!files::make_directories(output, &why)) throw config_error("--output", output, "cannot create it (" + why + ")");
  const std::string data_dir = output + "/.plot-data";
  if (!files::make_directories(data_dir, &why)) throw config_error("--output", output, "cannot write there (" + why + ")");
  auto data_file = [&](size_t run, const std::string& key) {
    return data_dir + "/run" + std::to_string(run) + "." + key + ".dat";
  };
  for (size_t r = 0; r < runs.size(); ++r)
    for (const auto& [key, points] : metrics[r]) {
      std::ofstream out(data_file(r, key));
      out.precision(10);
      for (const auto& [step, value] : points) out << step << ' ' << value << '\n';
      if (!out) throw config_error("--output", output, "cannot write there");
    }

  const std::vector<Chart> charts = {
      {"loss.png", "loss", "loss (nats per token)", {{"loss", ""}, {"eval_loss", " (eval)"}}, false},
      {"lr.png", "learning rate", "learning rate", {{"lr", ""}}, false},
      {"throughput.png", "throughput", "tokens/s", {{"tokens_per_s", ""}}, false},
      {"mfu.png", "model FLOP utilisation", "MFU", {{"mfu", ""}}, false},
  };
  std::ostringstream script;
  script << "set terminal pngcairo size " << width << "," << height << " noenhanced\n"
         << "set grid\nset key outside right top\nset xlabel \"step\"\n";
  std::vector<std::string> written;
  for (const Chart& chart : charts) {
    std::vector<std::string> plots;
    for (size_t r = 0; r < runs.size(); ++r)
      for (const auto& [key, suffix] : chart.series)
        if (metrics[r].count(key))
          plots.push_back(quoted(data_file(r, key)) + " using 1:2 with linespoints pointsize 0.5 title " +
                          quoted(run_name(runs[r]) + suffix));
    if (plots.empty()) continue;  // no run recorded it (MFU on a CPU without train.peak_tflops)
    script << "set output " << quoted(output + "/" + chart.file) << "\nset title " << quoted(chart.title)
           << "\nset ylabel " << quoted(chart.ylabel) << "\nplot ";
    for (size_t i = 0; i < plots.size(); ++i) script << (i ? ", \\\n     " : "") << plots[i];
    script << "\nunset output\n";
    written.push_back(output + "/" + chart.file);
  }
  if (written.empty()) throw data_error("plot: the runs' metrics.jsonl hold no records yet");

  FILE* gnuplot = popen("gnuplot 2>&1", "w");
  if (!gnuplot) throw Error(ExitCode::kInternal, "plot: cannot start gnuplot");
  const std::string text = script.str();
  const bool sent = std::fwrite(text.data(), 1, text.size(), gnuplot) == text.size();
  const int status = pclose(gnuplot);
  files::remove_tree(data_dir);
  if (!sent || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const bool missing = WIFEXITED(status) && WEXITSTATUS(status) == 127;
    throw Error(ExitCode::kUsage, missing ? "plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)"
                                          : "plot: gnuplot failed (its message is above)");
  }
  for (const std::string& file : written) std::cout << "wrote " << file << "\n";
  return 0;
}

}  // namespace dstrain
