#include "dstrain/parallel/rank_grid.h"

#include <algorithm>
#include <cstdint>

#include "dstrain/core/error.h"

namespace dstrain {

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> names;
  size_t start = 0;
  for (size_t dash; (dash = order.find('-', start)) != std::string::npos; start = dash + 1)
    names.push_back(order.substr(start, dash - start));
  names.push_back(order.substr(start));
  return names;
}

namespace {

bool is_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

// The names of `text`, or the reason they are not a list of distinct names.
std::vector<std::string> distinct_names(const std::string& text, std::string* problem) {
  std::vector<std::string> names = split_order(text);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!is_name(names[i])) {
      *problem = "expected dimension names of lower-case letters joined by '-', innermost first, e.g. tp-cp-dp-pp";
    } else if (std::find(names.begin(), names.begin() + i, names[i]) != names.begin() + i) {
      *problem = "names " + names[i] + " twice";
    }
    if (!problem->empty()) return {};
  }
  return names;
}

// "dp × pp = 2 × 3 = 6 must equal the number of ranks (4)", the dimensions by name. It names
// parallel.dp when the grid has dp, the size most often derived from the others (parallel.dp = 0),
// else the last dimension by name.
void check_product(int world, const std::map<std::string, int>& sizes) {
  std::string names, values;
  int64_t product = 1;
  for (const auto& [name, size] : sizes) {
    names += (names.empty() ? "" : " × ") + name;
    values += (values.empty() ? "" : " × ") + std::to_string(size);
    product = std::min<int64_t>(product * size, int64_t{INT32_MAX} + 1);  // no overflow, still ≠ world
  }
  if (product == world) return;
  const std::string key = sizes.count("dp") ? "dp" : sizes.rbegin()->first;
  throw config_error("parallel." + key, std::to_string(sizes.at(key)),
                     names + " = " + values + " = " + std::to_string(product) + " must equal the number of ranks (" +
                         std::to_string(world) + ")");
}

}  // namespace

RankGrid::RankGrid(int world, const std::string& order, const std::map<std::string, int>& sizes)
    : world_(world), order_(order) {
  std::string problem;
  dimensions_ = distinct_names(order, &problem);
  if (!problem.empty()) throw config_error("parallel.order", order, problem);
  for (const auto& [name, size] : sizes) {
    if (size < 1) throw config_error("parallel." + name, std::to_string(size), "expected at least 1");
    if (size > 1 && std::find(dimensions_.begin(), dimensions_.end(), name) == dimensions_.end())
      throw config_error("parallel.order", order, "lacks " + name + ", which has size " + std::to_string(size));
  }
  for (const std::string& name : dimensions_) {
    const auto given = sizes.find(name);
    sizes_[name] = given == sizes.end() ? 1 : given->second;
  }
  check_product(world, sizes_);
  int stride = 1;
  for (const std::string& name : dimensions_) {
    strides_[name] = stride;
    stride *= sizes_[name];
  }
}

int RankGrid::size(const std::string& dimension) const {
  const auto found = sizes_.find(dimension);
  return found == sizes_.end() ? 1 : found->second;
}

int RankGrid::stride(const std::string& dimension) const {
  const auto found = strides_.find(dimension);
  return found == strides_.end() ? 1 : found->second;  // any stride: the coordinate is always 0
}

int RankGrid::coordinate(int rank, const std::string& dimension) const {
  return rank / stride(dimension) % size(dimension);
}

std::vector<int> RankGrid::group(int rank, const std::string& dimensions) const {
  std::string problem;
  const std::vector<std::string> names = distinct_names(dimensions, &problem);
  if (!problem.empty()) throw Error(ExitCode::kInternal, "rank grid group \"" + dimensions + "\": " + problem);
  // Start from the member whose named coordinates are all 0, then let the first-named dimension
  // vary fastest.
  int first = rank;
  for (const std::string& name : names) first -= coordinate(rank, name) * stride(name);
  std::vector<int> members{first};
  for (const std::string& name : names) {
    std::vector<int> wider;
    for (int c = 0; c < size(name); ++c)
      for (int member : members) wider.push_back(member + c * stride(name));
    members = std::move(wider);
  }
  return members;
}

std::vector<std::vector<int>> RankGrid::groups(const std::string& dimensions) const {
  // A group's lowest rank is the one at coordinate 0 along the named dimensions: its first member.
  std::vector<std::vector<int>> all;
  for (int rank = 0; rank < world_; ++rank) {
    std::vector<int> members = group(rank, dimensions);
    if (members.front() == rank) all.push_back(std::move(members));
  }
  return all;
}

}  // namespace dstrain
