// The parts of LibTorch's C++ API that dstrain uses, included everywhere instead of
// <torch/torch.h> (which also brings datasets, serialization, JIT, ...) and precompiled once:
// LibTorch's headers are most of the build time.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/utils.h>
