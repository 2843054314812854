// `dstrain bench step|comm|memory|io`: figures a person compares across machines and versions.
// Each prints a short table on rank 0 and, with --bench.json FILE, writes the same as JSON.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "dstrain/core/config.h"
#include "dstrain/core/text.h"  // format_bytes, for the tables

namespace dstrain::bench {

// The options of `dstrain train` plus the [bench] section.
OptionTable option_table();

// Each runs after MPI_Init_thread; `options` are parsed with option_table().
nlohmann::json step(Options options);    // training steps on a random corpus: tokens/s, MFU, memory
nlohmann::json comm(const Options& options);    // collectives' bus bandwidth over message sizes
nlohmann::json memory(const Options& options);  // host and device copy bandwidth
nlohmann::json io(const Options& options);      // corpus read and checkpoint write bandwidth

}  // namespace dstrain::bench
