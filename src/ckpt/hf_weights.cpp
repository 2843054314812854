#include "dstrain/ckpt/hf_weights.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index, count);
  return name;
}

// "model-00001-of-00002.safetensors" and the like: what write_hf_weights may have written before.
bool is_shard_name(const std::string& name) {
  unsigned a = 0, b = 0;
  char rest[32] = "";
  return name.size() == shard_name(1, 1).size() &&
         std::sscanf(name.c_str(), "model-%5u-of-%5u.%31s", &a, &b, rest) == 3 && std::string(rest) == "safetensors";
}

}  // namespace

HfWeights::HfWeights(const std::string& path) {
  std::map<std::string, std::string> weight_map;  // from the index, when there is one
  if (!files::is_directory(path)) {
    if (!files::is_regular_file(path)) throw Error(kCode, path + ": no such file or directory");
    paths_.push_back(path);
  } else if (files::is_regular_file(path + "/" + kHfIndexFile)) {
    const std::string index_path = path + "/" + kHfIndexFile;
    std::ifstream in(index_path);
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json index = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(kCode, index_path + ": not a JSON object with a \"weight_map\" object");
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty())
        throw Error(kCode, index_path + ": the weight_map entry of " + name + " is not a file name");
      weight_map[name] = file.get<std::string>();
      if (shards.insert(file.get<std::string>()).second) paths_.push_back(path + "/" + file.get<std::string>());
    }
    std::sort(paths_.begin(), paths_.end());
  } else if (files::is_regular_file(path + "/" + kHfSingleFile)) {
    paths_.push_back(path + "/" + kHfSingleFile);
  } else {
    throw Error(kCode, path + ": holds neither " + std::string(kHfIndexFile) + " nor " + kHfSingleFile);
  }
  for (const std::string& file : paths_) {
    if (!files::is_regular_file(file))
      throw Error(kCode, file + ": no such file (named by " + path + "/" + kHfIndexFile + ")");
    readers_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const SafetensorsEntry& e : readers_.back()->entries()) index_.emplace_back(e.name, readers_.size() - 1);
  }
  std::sort(index_.begin(), index_.end());
  for (size_t i = 1; i < index_.size(); ++i)
    if (index_[i].first == index_[i - 1].first)
      throw Error(kCode, "tensor " + index_[i].first + " is in both " + paths_[index_[i - 1].second] + " and " +
                             paths_[index_[i].second]);
  for (const auto& [name, file] : weight_map) {
    const SafetensorsReader* reader = reader_of(name);
    if (!reader || reader->path() != path + "/" + file)
      throw Error(kCode, path + "/" + kHfIndexFile + " maps tensor " + name + " to " + file + ", which does not hold it");
  }
}

const SafetensorsReader* HfWeights::reader_of(const std::string& name) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), name,
                             [](const std::pair<std::string, size_t>& e, const std::string& n) { return e.first < n; });
  return it != index_.end() && it->first == name ? readers_[it->second].get() : nullptr;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> names;
  for (const auto& entry : index_) names.push_back(entry.first);
  return names;
}

const SafetensorsEntry* HfWeights::find(const std::string& name) const {
  const SafetensorsReader* reader = reader_of(name);
  return reader ? reader->find(name) : nullptr;
}

const std::string& HfWeights::file_of(const std::string& name) const {
  const SafetensorsReader* reader = reader_of(name);
  if (!reader) throw Error(kCode, "no file holds tensor " + name);
  return reader->path();
}

torch::Tensor HfWeights::read(const std::string& name) const {
  const SafetensorsReader* reader = reader_of(name);
  if (!reader) throw Error(kCode, "tensor " + name + " is in none of " + std::to_string(paths_.size()) + " file(s)");
  return reader->read(name);
}

torch::Tensor HfWeights::read_e4m3(const std::string& name) const {
  const SafetensorsReader* reader = reader_of(name);
  if (!reader) throw Error(kCode, "tensor " + name + " is in none of " + std::to_string(paths_.size()) + " file(s)");
  return reader->read_e4m3(name);
}

std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<SafetensorsSpec>& specs,
                                          const TensorSource& source, uint64_t max_shard_bytes) {
  std::vector<SafetensorsSpec> sorted = specs;
  std::sort(sorted.begin(), sorted.end(), [](const SafetensorsSpec& a, const SafetensorsSpec& b) { return a.name < b.name; });
  // Shards filled in name order; a tensor that would overflow the current one starts the next.
  std::vector<std::vector<SafetensorsSpec>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const SafetensorsSpec& s : sorted) {
    const uint64_t bytes = safetensors_bytes(s);
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(s);
    in_shard += bytes;
    total += bytes;
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i)
    names.push_back(shards.size() == 1 ? kHfSingleFile : shard_name(i + 1, shards.size()));
  if (shards.size() > 1) names.push_back(kHfIndexFile);

  std::string why;
  if (!files::make_directories(dir, &why)) throw Error(kCode, "cannot create " + dir + ": " + why);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::string> written;  // temporary files complete so far
  try {
    for (size_t i = 0; i < shards.size(); ++i) {
      write_safetensors(dir + "/" + names[i], shards[i], source, metadata, /*rename=*/false);
      written.push_back(dir + "/" + names[i] + ".tmp");
    }
    if (shards.size() > 1) {
      nlohmann::json weight_map = nlohmann::json::object();
      for (size_t i = 0; i < shards.size(); ++i)
        for (const SafetensorsSpec& s : shards[i]) weight_map[s.name] = names[i];
      const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      const std::string tmp = dir + "/" + kHfIndexFile + ".tmp";
      std::ofstream out(tmp, std::ios::trunc);
      out << index.dump(2) << "\n";
      out.close();
      written.push_back(tmp);
      if (!out) throw Error(kCode, tmp + ": cannot write");
    }
    // An earlier export's index goes first: interrupted among the renames below, the directory
    // holds no index that would join old shards to new ones.
    std::remove((dir + "/" + kHfIndexFile).c_str());
    for (size_t i = 0; i < names.size(); ++i) {
      if (!files::rename(written[i], dir + "/" + names[i], &why))
        throw Error(kCode, "cannot rename " + written[i] + " to " + dir + "/" + names[i] + ": " + why);
    }
  } catch (...) {
    for (const std::string& tmp : written) std::remove(tmp.c_str());
    throw;
  }
  const std::set<std::string> mine(names.begin(), names.end());
  for (const std::string& entry : files::directory_entries(dir))
    if ((entry == kHfSingleFile || entry == kHfIndexFile || is_shard_name(entry)) && !mine.count(entry))
      std::remove((dir + "/" + entry).c_str());
  return names;
}

}  // namespace dstrain
