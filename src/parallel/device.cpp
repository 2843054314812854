#include "dstrain/parallel/device.h"

#include "dstrain/core/accelerator.h"
#include "dstrain/parallel/mpi_check.h"

namespace dstrain {

const EnumNames<DeviceRequest>& device_request_names() {
  static const EnumNames<DeviceRequest> names = {
      {"auto", DeviceRequest::kAuto}, {"cpu", DeviceRequest::kCpu}, {"cuda", DeviceRequest::kCuda}};
  return names;
}

DevicePlacement place_rank(DeviceRequest requested) {
  DevicePlacement placement;
  // Ranks that share memory share a node: their order there picks the GPU, as srun's
  // SLURM_LOCALID and mpirun's OMPI_COMM_WORLD_LOCAL_RANK would, under either launcher.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &placement.local_rank));
  MPI_CHECK(MPI_Comm_size(node, &placement.local_size));
  MPI_CHECK(MPI_Comm_free(&node));

  if (!computes_on_gpu(requested)) return placement;
  const int gpus = accel::device_count();
  if (gpus == 0)
    throw config_error("train.device", name_of(device_request_names(), requested),
                       accel::cuda_compiled() ? "no GPU is visible to this process (CUDA_VISIBLE_DEVICES?)"
                                              : "this dstrain was built with a LibTorch without CUDA; use cpu");
  const int index = placement.local_rank % gpus;
  placement.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  accel::set_current_device(index);
  placement.name = accel::device_name(index);
  return placement;
}

bool computes_on_gpu(DeviceRequest requested) {
  return requested == DeviceRequest::kCuda || (requested == DeviceRequest::kAuto && accel::device_count() > 0);
}

}  // namespace dstrain
