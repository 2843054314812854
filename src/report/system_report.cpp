#include "dstrain/report/system_report.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <hdf5.h>
#include <mpi.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/blas.h"
#include "dstrain/core/error.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/model/cuda_kernels.h"
#ifdef DSTRAIN_WITH_NCCL
#include <nccl.h>
#endif

namespace dstrain {
namespace {

// /proc/cpuinfo's "model name" (x86) or "Model"/"Hardware" (ARM); "unknown CPU" elsewhere.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    for (const char* key : {"model name", "Model", "Hardware"}) {
      if (line.rfind(key, 0) != 0) continue;
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string mpi_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_CHECK(MPI_Get_library_version(text, &length));
  std::string version(text, static_cast<size_t>(length));
  // Open MPI's answer runs over several lines with its repository and date: the first says it.
  version = version.substr(0, version.find_first_of("\n,"));
  while (!version.empty() && (version.back() == ' ' || version.back() == '\0')) version.pop_back();
  return version;
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::string nccl_version() {
#ifdef DSTRAIN_WITH_NCCL
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL ≥ 2.9 encodes major × 10000 + minor × 100 + patch; earlier major × 1000 + minor × 100 + patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
#else
  return "not built";
#endif
}

std::string cuda_version() {
  if (!accel::cuda_compiled()) return "not built";
  try {
    const long code = at::detail::getCUDAHooks().versionCUDART();  // major × 1000 + minor × 10
    return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10);
  } catch (const std::exception&) {
    return "unknown";
  }
}

}  // namespace

std::string system_report() {
  char host[256] = "unknown";
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  std::string report = std::string("host ") + host + ": " + cpu_model() + ", " + std::to_string(cores) +
                       " cores, " + gib(memory) + " memory";
  const int gpus = accel::device_count();
  if (gpus == 0) report += "; no GPU";
  for (int i = 0; i < gpus; ++i)
    report += std::string(i == 0 ? "; GPUs: " : ", ") + std::to_string(i) + " " + accel::device_name(i) + " " +
              gib(static_cast<double>(accel::device_total_memory(i)));
  report += std::string("\nLibTorch ") + TORCH_VERSION + ", MPI " + mpi_version() + ", NCCL " + nccl_version() +
            ", HDF5 " + hdf5_version() + ", CUDA " + cuda_version() +
            (cuda_kernels_built() ? " with dstrain's kernels" : "") + ", BLAS " + blas::loaded().name;
  return report;
}

}  // namespace dstrain
