// Which device each rank computes on: the GPU of its node-local rank, or the CPU.
#pragma once

#include <string>

#include "dstrain/core/config.h"
#include "dstrain/core/torch_api.h"

namespace dstrain {

// train.device: cpu; cuda, the GPU of the rank's place on its node; auto, cuda where there is one.
enum class DeviceRequest { kAuto, kCpu, kCuda };
const EnumNames<DeviceRequest>& device_request_names();  // auto, cpu, cuda

struct DevicePlacement {
  torch::Device device = torch::kCPU;
  int local_rank = 0;  // among the ranks of this node (MPI shared-memory split)
  int local_size = 1;
  std::string name = "cpu";  // the GPU's name, for the start-up report and MFU
};

// Collective over MPI_COMM_WORLD. `requested` is train.device: cpu; cuda, GPU local_rank mod the
// node's GPU count (an error without one); auto, cuda when LibTorch has CUDA and the node has a
// GPU, else cpu. Ranks beyond the GPU count share GPUs, which only comm.backend = mpi allows.
DevicePlacement place_rank(DeviceRequest requested);

// Whether train.device = `requested` computes on a GPU of this host, as place_rank places it:
// cuda, or auto where the host has one.
bool computes_on_gpu(DeviceRequest requested);

}  // namespace dstrain
