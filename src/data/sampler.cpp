#include "dstrain/data/sampler.h"

#include <numeric>
#include <utility>

#include "dstrain/core/random.h"

namespace dstrain {

std::vector<uint64_t> epoch_permutation(uint64_t n_samples, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> permutation(n_samples);
  std::iota(permutation.begin(), permutation.end(), 0);
  SplitMix64 rng(mix_seed(seed, epoch));
  for (uint64_t i = n_samples; i > 1; --i) std::swap(permutation[i - 1], permutation[rng.below(i)]);
  return permutation;
}

GlobalSampler::GlobalSampler(uint64_t n_samples, uint64_t seed, bool shuffle)
    : n_samples_(n_samples), seed_(seed), shuffle_(shuffle) {}

uint64_t GlobalSampler::sample_at(uint64_t position) {
  uint64_t epoch = position / n_samples_, index = position % n_samples_;
  if (!shuffle_) return index;
  if (epoch != cached_epoch_) {
    permutation_ = epoch_permutation(n_samples_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return permutation_[index];
}

}  // namespace dstrain
