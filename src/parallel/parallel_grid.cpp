#include "dstrain/parallel/parallel_grid.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

const std::vector<std::string> kDimensions = {"tp", "cp", "ep", "dp", "pp"};

std::string joined(const std::vector<std::string>& names) {
  std::string order;
  for (const std::string& name : names) order += (order.empty() ? "" : "-") + name;
  return order;
}

// The names of `all` that `keep` lists, in the sequence of `all`.
std::vector<std::string> subsequence(const std::vector<std::string>& all, const std::vector<std::string>& keep) {
  std::vector<std::string> kept;
  for (const std::string& name : all)
    if (std::find(keep.begin(), keep.end(), name) != keep.end()) kept.push_back(name);
  return kept;
}

}  // namespace

const EnumNames<Group>& group_names() {
  static const EnumNames<Group> names = {{"tp", Group::kTp},  {"cp", Group::kCp},      {"dp", Group::kDp},
                                         {"pp", Group::kPp},  {"dp-cp", Group::kDpCp}, {"ep", Group::kEp},
                                         {"edp", Group::kEdp}};
  return names;
}

const std::vector<Group>& every_group() {
  static const std::vector<Group> groups = {Group::kTp,   Group::kCp, Group::kDp, Group::kPp,
                                            Group::kDpCp, Group::kEp, Group::kEdp};
  return groups;
}

std::string ParallelGrid::complete_order(const std::string& order) {
  std::vector<std::string> names = split_order(order);
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::find(kDimensions.begin(), kDimensions.end(), names[i]) == kDimensions.end())
      throw config_error("parallel.order", order,
                         "expected the names tp, cp, ep, dp and pp, each once, joined by '-', innermost first "
                         "(e.g. tp-cp-ep-dp-pp)");
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i))
      throw config_error("parallel.order", order, "names " + names[i] + " twice");
  }
  auto has = [&](const char* name) { return std::find(names.begin(), names.end(), name) != names.end(); };
  if (!has("dp") || !has("pp"))
    throw config_error("parallel.order", order, "must name dp and pp (tp, cp and ep may be left out)");
  // A name left out goes just inside the first of those that follow it in tp-cp-ep-dp: ep inside
  // dp, cp inside both, tp innermost of all. (Not simply innermost: with pp first, tp and cp
  // before it would set the dense grid's stages further apart than the expert grid's.)
  const std::vector<std::string> canonical = {"tp", "cp", "ep", "dp"};
  auto place = [&](const std::string& name) { return std::find(canonical.begin(), canonical.end(), name); };
  for (auto name = canonical.rbegin() + 1; name != canonical.rend(); ++name) {
    if (has(name->c_str())) continue;
    const auto after = std::find_if(names.begin(), names.end(), [&](const std::string& n) {
      return place(n) != canonical.end() && place(n) > place(*name);
    });
    names.insert(after, *name);
  }
  return joined(names);
}

namespace {

// The dense grid of `config`: tp, cp, dp and pp in the order's sequence.
RankGrid dense_grid(const ParallelConfig& c, const std::vector<std::string>& order) {
  const std::map<std::string, int> sizes = {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}};
  int64_t world = 1;
  for (const auto& [name, size] : sizes) {
    if (size < 1) throw config_error("parallel." + name, std::to_string(size), "expected at least 1");
    world *= size;
  }
  if (world > INT32_MAX) throw config_error("parallel.dp", std::to_string(c.dp), "more ranks than MPI can number");
  return RankGrid(static_cast<int>(world), joined(subsequence(order, {"tp", "cp", "dp", "pp"})), sizes);
}

// The expert grid: ep, edp (where the order says dp) and pp.
RankGrid expert_grid(const ParallelConfig& c, const std::vector<std::string>& order, int world) {
  const int holders = c.tp * c.cp * c.dp;  // the ranks of a stage
  if (c.ep < 1 || holders % c.ep != 0)
    throw config_error("parallel.ep", std::to_string(c.ep),
                       "must divide parallel.tp × cp × dp = " + std::to_string(holders) +
                           ": the expert-parallel groups are made of a stage's ranks");
  std::vector<std::string> names = subsequence(order, {"ep", "dp", "pp"});
  std::replace(names.begin(), names.end(), std::string("dp"), std::string("edp"));
  return RankGrid(world, joined(names), {{"ep", c.ep}, {"edp", holders / c.ep}, {"pp", c.pp}});
}

}  // namespace

ParallelGrid::ParallelGrid(const ParallelConfig& c)
    : order_(complete_order(c.order)),
      dense_(dense_grid(c, split_order(order_))),
      expert_(expert_grid(c, split_order(order_), dense_.world())) {
  for (int rank = 0; rank < world(); ++rank) {
    const int dense = dense_.coordinate(rank, "pp"), expert = expert_.coordinate(rank, "pp");
    if (dense != expert)
      throw config_error("parallel.order", c.order,
                         "puts rank " + std::to_string(rank) + " on pipeline stage " + std::to_string(dense) +
                             " of the dense grid (tp, cp, dp, pp) but on stage " + std::to_string(expert) +
                             " of the expert grid (ep, dp, pp); put pp first or last");
  }
}

const RankGrid& ParallelGrid::grid_of(Group group) const {
  return group == Group::kEp || group == Group::kEdp ? expert_ : dense_;
}

namespace {

// The grid dimensions of a group, innermost first: its name (group_names).
const std::string& dimensions_of(Group group) { return name_of(group_names(), group); }

}  // namespace

int ParallelGrid::size(Group group) const {
  int size = 1;
  for (const std::string& name : split_order(dimensions_of(group))) size *= grid_of(group).size(name);
  return size;
}

std::vector<int> ParallelGrid::members(Group group, int rank) const {
  return grid_of(group).group(rank, dimensions_of(group));
}

int ParallelGrid::rank_in(Group group, int rank) const {
  const std::vector<int> all = members(group, rank);
  return static_cast<int>(std::find(all.begin(), all.end(), rank) - all.begin());
}

std::vector<std::vector<int>> ParallelGrid::all(Group group) const {
  return grid_of(group).groups(dimensions_of(group));
}

bool ParallelGrid::same_places(const ParallelGrid& other) const {
  if (world() != other.world()) return false;
  for (Group group : every_group())
    if (all(group) != other.all(group)) return false;
  return true;
}

}  // namespace dstrain
