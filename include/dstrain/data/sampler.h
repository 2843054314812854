// Which sample of the corpus sits at each global position of training.
//
// A sample k is the seq_len + 1 tokens starting at k × seq_len (inputs and shifted targets).
// Epoch e visits every sample once, in a permutation drawn from (seed, e). Global position p is
// sample permutation_e[p mod n] with e = p div n: the state of the data stream is one number,
// the count of samples consumed, whatever the layout, so that a run can resume on another one.
#pragma once

#include <cstdint>
#include <vector>

namespace dstrain {

std::vector<uint64_t> epoch_permutation(uint64_t n_samples, uint64_t seed, uint64_t epoch);

class GlobalSampler {
 public:
  // shuffle = false visits samples in order (evaluation).
  GlobalSampler(uint64_t n_samples, uint64_t seed, bool shuffle);
  uint64_t n_samples() const { return n_samples_; }
  uint64_t sample_at(uint64_t position);

 private:
  uint64_t n_samples_, seed_;
  bool shuffle_;
  uint64_t cached_epoch_ = UINT64_MAX;
  std::vector<uint64_t> permutation_;
};

// The global batch of step s covers positions [s × G, (s + 1) × G) with G = micro_batch ×
// grad_accum × dp. DP rank r takes the contiguous block r of it, as grad_accum micro-batches:
// the union over ranks is the same set of samples whatever dp is.
struct BatchLayout {
  uint64_t micro_batch, grad_accum, dp_size, dp_rank;
  uint64_t global_batch() const { return micro_batch * grad_accum * dp_size; }
  uint64_t position(uint64_t step, uint64_t micro, uint64_t row) const {
    return position_in(step * global_batch(), grad_accum, micro, row);
  }
  // The same in a step of `accum` micro-batches per rank that starts after `first` samples (a
  // step of a batch-size ramp-up).
  uint64_t position_in(uint64_t first, uint64_t accum, uint64_t micro, uint64_t row) const {
    return first + dp_rank * micro_batch * accum + micro * micro_batch + row;
  }
};

}  // namespace dstrain
