// What the rest of dstrain needs to know about the GPU, without including CUDA headers: whether
// this LibTorch has CUDA, how many devices a node has, their names and memory, and the
// caching allocator's peak. A CPU-only build answers "no GPU" and never fails.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/torch_api.h"

namespace dstrain::accel {

bool cuda_compiled();  // LibTorch built with CUDA (and dstrain with it)
int device_count();    // 0 without CUDA
std::string device_name(int index);
// The GPU's UUID (16 bytes): the same physical GPU gives the same UUID in every process, however
// CUDA_VISIBLE_DEVICES numbers it there.
std::string device_uuid(int index);
int64_t device_total_memory(int index);

// Makes `index` this process's current GPU: kernels, NCCL and the caching allocator use it.
void set_current_device(int index);

// Waits for every kernel queued on `device` (a no-op on the CPU).
void synchronize(const torch::Device& device);

// Peak bytes held by tensors on `device` since the last reset (the caching allocator's count;
// 0 on the CPU, which has no such counter).
int64_t peak_allocated_bytes(const torch::Device& device);
void reset_peak_allocated_bytes(const torch::Device& device);

// Dense peak TFLOP/s of the GPU named `name` for `precision` ("bf16", "fp16", "fp32"), from the
// vendor's data sheets (A100, H100, H200); 0 when unknown. MFU divides by this.
double known_peak_tflops(const std::string& name, const std::string& precision);

}  // namespace dstrain::accel
