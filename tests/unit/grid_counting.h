// Rank grids written out by counting, without strides or division: what the grid tests hold the
// grids' own arithmetic (parallel/rank_grid.h, parallel/parallel_grid.h) against.
#pragma once

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::test {

using Coordinates = std::map<std::string, int>;

// The grid written out by counting, without strides or division: rank r is the r-th coordinate
// tuple when the first (innermost) dimension runs fastest, like the digits of an odometer.
inline std::vector<Coordinates> count_out(const std::vector<std::pair<std::string, int>>& dimensions) {
  std::vector<Coordinates> table;
  Coordinates c;
  for (const auto& [name, size] : dimensions) c[name] = 0;
  for (bool more = true; more;) {
    table.push_back(c);
    more = false;
    for (const auto& [name, size] : dimensions) {
      if (++c[name] < size) {
        more = true;
        break;
      }
      c[name] = 0;  // carry into the next dimension outwards
    }
  }
  return table;
}

inline std::vector<std::string> split(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream in(names);
  for (std::string name; std::getline(in, name, '-');) out.push_back(name);
  return out;
}

// The group by its definition: the ranks whose coordinates off the named dimensions equal mine,
// sorted by their coordinates along the named ones, the last-named most significant.
inline std::vector<int> expected_group(const std::vector<Coordinates>& table, int rank, const std::string& names) {
  const std::vector<std::string> named = split(names);
  auto is_named = [&](const std::string& d) { return std::find(named.begin(), named.end(), d) != named.end(); };
  std::vector<std::pair<std::vector<int>, int>> keyed;  // (coordinates, last-named first; rank)
  for (int other = 0; other < static_cast<int>(table.size()); ++other) {
    bool same = true;
    for (const auto& [d, value] : table[rank]) same = same && (is_named(d) || table[other].at(d) == value);
    if (!same) continue;
    std::vector<int> key;
    for (auto d = named.rbegin(); d != named.rend(); ++d) key.push_back(table[other].at(*d));
    keyed.push_back({key, other});
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> members;
  for (const auto& entry : keyed) members.push_back(entry.second);
  return members;
}

}  // namespace dstrain::test
