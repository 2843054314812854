#include "dstrain/data/mixture.h"

#include <cmath>

#include "dstrain/core/error.h"
#include "dstrain/core/random.h"
#include "dstrain/core/xxhash.h"
#include <cstdio>

namespace dstrain {

std::vector<MixtureComponent> parse_mixture(const std::string& spec, const std::string& key) {
  std::vector<MixtureComponent> components;
  size_t start = 0, weighted = 0;  // entries with a weight
  double total = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string entry = spec.substr(start, comma - start);
    MixtureComponent component{entry, 1.0};
    size_t colon = entry.rfind(':');
    if (colon != std::string::npos) {
      const std::string weight = entry.substr(colon + 1);
      char* end = nullptr;
      double value = std::strtod(weight.c_str(), &end);
      if (weight.empty() || end != weight.c_str() + weight.size() || !(value > 0) || !std::isfinite(value))
        throw config_error(key, spec, "'" + weight + "' (the weight of " + entry.substr(0, colon) +
                                          ") is not a positive number; expected FILE or FILE:WEIGHT,FILE:WEIGHT,...");
      component = MixtureComponent{entry.substr(0, colon), value};
      ++weighted;
    }
    if (component.path.empty()) throw config_error(key, spec, "an empty file name; expected FILE:WEIGHT,FILE:WEIGHT,...");
    total += component.weight;
    components.push_back(component);
    start = comma + 1;
  }
  // "a.h5:0.7,b.h5" would give b.h5 a weight of 1, which no one means.
  if (weighted != 0 && weighted != components.size())
    throw config_error(key, spec, "give every corpus a weight (FILE:WEIGHT,FILE:WEIGHT,...) or none");
  for (MixtureComponent& c : components) c.weight /= total;
  return components;
}

uint64_t Mixture::n_tokens() const {
  uint64_t total = 0;
  for (const auto& corpus : corpora) total += corpus->info().n_tokens;
  return total;
}

std::string Mixture::fingerprint() const {
  if (corpora.size() == 1) return corpus_fingerprint(*corpora[0]);
  std::string identity;
  for (size_t c = 0; c < corpora.size(); ++c) {
    char weight[32];
    std::snprintf(weight, sizeof weight, "%.17g", weights[c]);
    identity += corpus_fingerprint(*corpora[c]) + ":" + weight + ",";
  }
  return hex64(xxh64(identity.data(), identity.size()));
}

Mixture open_mixture(const std::string& spec, const std::string& key) {
  Mixture mixture;
  for (const MixtureComponent& component : parse_mixture(spec, key)) {
    mixture.corpora.push_back(std::make_shared<CorpusReader>(component.path));
    mixture.weights.push_back(component.weight);
    const CorpusInfo& first = mixture.corpora.front()->info(), &info = mixture.corpora.back()->info();
    if (info.vocab_size != first.vocab_size || info.eod_id != first.eod_id)
      throw config_error(key, spec, info.path + " (vocabulary " + std::to_string(info.vocab_size) + ", end-of-document " +
                                        std::to_string(info.eod_id) + ") and " + first.path + " (" +
                                        std::to_string(first.vocab_size) + ", " + std::to_string(first.eod_id) +
                                        ") do not share a tokenizer");
  }
  return mixture;
}

MixedSampler::MixedSampler(const std::vector<uint64_t>& samples_per_corpus, const std::vector<double>& weights,
                           uint64_t seed, bool shuffle)
    : weights_(weights), taken_(weights.size(), 0) {
  for (size_t c = 0; c < samples_per_corpus.size(); ++c)
    samplers_.emplace_back(samples_per_corpus[c], samples_per_corpus.size() == 1 ? seed : mix_seed(seed, c + 1), shuffle);
}

MixedSampler::Pick MixedSampler::pick(uint64_t position) {
  if (weights_.size() == 1) return Pick{0, samplers_[0].sample_at(position)};  // the single-corpus stream
  if (position < next_position_) {
    next_position_ = 0;
    std::fill(taken_.begin(), taken_.end(), 0);
  }
  for (;; ++next_position_) {
    size_t best = 0;
    double best_deficit = -1e300;
    for (size_t c = 0; c < weights_.size(); ++c) {
      double deficit = weights_[c] * static_cast<double>(next_position_ + 1) - static_cast<double>(taken_[c]);
      if (deficit > best_deficit) best = c, best_deficit = deficit;
    }
    const uint64_t k = taken_[best]++;
    if (next_position_ == position) {
      ++next_position_;
      return Pick{best, samplers_[best].sample_at(k)};
    }
  }
}

}  // namespace dstrain
