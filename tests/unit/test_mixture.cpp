// Mixtures of corpora: the weights parsed and normalized, every prefix of the stream in
// proportion, each corpus's samples drawn as its own epochs, and a loader that resumes exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dstrain/data/loader.h"
#include "dstrain/data/mixture.h"
#include "dstrain/data/prep.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

TEST(Mixture, ParsesFilesAndNormalizesWeights) {
  auto one = parse_mixture("data/a.h5", "data.train");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].path, "data/a.h5");
  EXPECT_EQ(one[0].weight, 1.0);
  auto two = parse_mixture("a.h5:2,b.h5:6", "data.train");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].path, "b.h5");
  EXPECT_DOUBLE_EQ(two[0].weight, 0.25);
  EXPECT_DOUBLE_EQ(two[1].weight, 0.75);
  expect_error([] { parse_mixture("a.h5:0.7,b.h5:x", "data.train"); }, ExitCode::kUsage, {"data.train", "'x'", "b.h5"});
  expect_error([] { parse_mixture("a.h5:-1", "data.train"); }, ExitCode::kUsage, {"data.train", "'-1'"});
  expect_error([] { parse_mixture("a.h5,,b.h5", "data.train"); }, ExitCode::kUsage, {"data.train", "empty file name"});
  // Without weights the corpora weigh alike; with some, every one needs its own.
  auto alike = parse_mixture("a.h5,b.h5", "data.train");
  EXPECT_DOUBLE_EQ(alike[1].weight, 0.5);
  expect_error([] { parse_mixture("a.h5:0.7,b.h5", "data.train"); }, ExitCode::kUsage,
               {"data.train = a.h5:0.7,b.h5: give every corpus a weight"});
}

TEST(Mixture, EveryPrefixHoldsEachCorpusInProportionAndEachCorpusItsOwnEpochs) {
  const std::vector<double> weights = {0.7, 0.2, 0.1};
  const std::vector<uint64_t> samples = {50, 7, 1000};
  MixedSampler sampler(samples, weights, 3, true);
  std::vector<uint64_t> taken(3, 0);
  std::vector<std::vector<uint64_t>> drawn(3);
  for (uint64_t p = 0; p < 5000; ++p) {
    MixedSampler::Pick pick = sampler.pick(p);
    ++taken[pick.corpus];
    drawn[pick.corpus].push_back(pick.sample);
    for (size_t c = 0; c < 3; ++c)
      ASSERT_LE(std::abs(static_cast<double>(taken[c]) - weights[c] * static_cast<double>(p + 1)), 1.0)
          << "corpus " << c << " after " << p + 1 << " samples";
  }
  // Corpus 1 (7 samples) went through 142 epochs: each a permutation, not all the same one.
  for (size_t start = 0; start + 7 <= drawn[1].size(); start += 7) {
    std::vector<uint64_t> epoch(drawn[1].begin() + start, drawn[1].begin() + start + 7), sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> all(7);
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(sorted, all);
  }
  EXPECT_NE(std::vector<uint64_t>(drawn[1].begin(), drawn[1].begin() + 7),
            std::vector<uint64_t>(drawn[1].begin() + 7, drawn[1].begin() + 14));
  // Deterministic, also when asked out of order (a resumed run starts in the middle).
  MixedSampler again(samples, weights, 3, true);
  for (uint64_t p : {4000u, 17u, 4999u, 0u}) {
    MixedSampler fresh(samples, weights, 3, true);
    MixedSampler::Pick a = again.pick(p), b = fresh.pick(p);
    EXPECT_EQ(a.corpus, b.corpus);
    EXPECT_EQ(a.sample, b.sample);
  }
  MixedSampler other_seed(samples, weights, 4, true);
  bool differs = false;
  MixedSampler base(samples, weights, 3, true);
  for (uint64_t p = 0; p < 100; ++p) differs |= base.pick(p).sample != other_seed.pick(p).sample;
  EXPECT_TRUE(differs);
}

TEST(Mixture, LoaderMixesCorporaAndResumesExactly) {
  TempDir dir;
  dir.write("a.txt", std::string(4000, 'a'));
  dir.write("b.txt", std::string(900, 'b'));
  for (const char* name : {"a", "b"}) {
    PrepOptions prep;
    prep.inputs = {dir.path(std::string(name) + ".txt")};
    prep.output = dir.path(std::string(name) + ".h5");
    run_prep(prep);
  }
  Mixture mixture = open_mixture(dir.path("a.h5") + ":0.25," + dir.path("b.h5") + ":0.75", "data.train");
  EXPECT_EQ(mixture.n_tokens(), 4001u + 901u);
  EXPECT_NE(mixture.fingerprint(), open_mixture(dir.path("a.h5") + ":0.5," + dir.path("b.h5") + ":0.5", "x").fingerprint());
  LoaderOptions options;
  options.seq_len = 16;
  options.layout = {4, 2, 1, 0};
  options.seed = 9;
  options.model_vocab = 257;
  DataLoader loader(mixture, options, 0);
  uint64_t rows_b = 0, rows = 0;
  std::vector<torch::Tensor> batches;
  for (int m = 0; m < 40; ++m) {
    torch::Tensor batch = loader.next();
    batches.push_back(batch);
    for (int64_t r = 0; r < batch.size(0); ++r, ++rows) {
      int64_t first = batch[r][0].item<int64_t>();
      ASSERT_TRUE(first == 'a' || first == 'b' || first == 256);
      // A row comes from one corpus: its tokens are a's, or b's, and end-of-document tokens.
      bool is_b = (batch[r] == 'b').any().item<bool>(), is_a = (batch[r] == 'a').any().item<bool>();
      ASSERT_NE(is_a, is_b);
      rows_b += is_b;
    }
  }
  EXPECT_NEAR(static_cast<double>(rows_b) / static_cast<double>(rows), 0.75, 1.0 / static_cast<double>(rows));
  DataLoader resumed(mixture, options, 7 * 8);  // 7 steps of 8 samples: micro-batch 14
  for (int m = 14; m < 40; ++m) ASSERT_TRUE(torch::equal(resumed.next(), batches[m])) << m;

  dir.write("c.txt", "c");
  PrepOptions tiny;
  tiny.inputs = {dir.path("c.txt")};
  tiny.output = dir.path("c.h5");
  run_prep(tiny);
  Mixture with_tiny = open_mixture(dir.path("a.h5") + ":1," + dir.path("c.h5") + ":1", "data.train");
  expect_error([&] { DataLoader small(with_tiny, options, 0); }, ExitCode::kData, {"c.h5", "fewer than one"});
}
