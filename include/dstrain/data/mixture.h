// Training on several corpora at once, in given proportions: data.train = a.h5:0.7,b.h5:0.3.
//
// Global position p (the same positions as for one corpus: docs/parallelism.md, "Data order") goes to the
// corpus c whose share is furthest behind, c = argmax_c (w_c × (p + 1) − taken_c(p)), lowest c
// on ties, so every prefix of the stream holds each corpus within one sample of its weight. The
// corpus's own taken_c-th sample is then drawn as for a single corpus, by its own permutation
// per epoch (seed mixed with c): a small corpus repeats (more epochs), a large one is only
// partly seen. The state is still the number of samples consumed; the assignment is
// recomputed from position 0, so a resumed run continues exactly. One corpus with no weight
// is exactly the single-corpus stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/data/corpus.h"
#include "dstrain/data/sampler.h"

namespace dstrain {

struct MixtureComponent {
  std::string path;
  double weight = 1.0;  // normalized: the weights sum to 1
};

// "a.h5" or "a.h5:0.7,b.h5:0.3" (weights need not sum to 1; they are normalized). Throws
// Error(kUsage) naming `key` for a weight that is not a positive number or an empty entry.
std::vector<MixtureComponent> parse_mixture(const std::string& spec, const std::string& key);

struct Mixture {
  std::vector<std::shared_ptr<const CorpusReader>> corpora;
  std::vector<double> weights;

  uint64_t n_tokens() const;
  // One corpus: its fingerprint, unchanged. Several: a fingerprint of theirs and the weights.
  std::string fingerprint() const;
};

// Opens every corpus of the spec; they must agree on vocabulary and end-of-document token.
Mixture open_mixture(const std::string& spec, const std::string& key);

// Which corpus, and which of its samples, sits at each global position.
class MixedSampler {
 public:
  MixedSampler(const std::vector<uint64_t>& samples_per_corpus, const std::vector<double>& weights, uint64_t seed,
               bool shuffle);
  struct Pick {
    size_t corpus;
    uint64_t sample;
  };
  // Fast for rising positions (one rank's stream); an earlier one recomputes from 0.
  Pick pick(uint64_t position);

 private:
  std::vector<double> weights_;
  std::vector<GlobalSampler> samplers_;
  uint64_t next_position_ = 0;
  std::vector<uint64_t> taken_;
};

}  // namespace dstrain
