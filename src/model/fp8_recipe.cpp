#include "dstrain/model/fp8_recipe.h"

#include <stdexcept>

namespace dstrain {

const EnumNames<Fp8Recipe>& fp8_recipe_names() {
  static const EnumNames<Fp8Recipe> names = {{"none", Fp8Recipe::kNone},
                                             {"tensorwise", Fp8Recipe::kTensorwise},
                                             {"rowwise", Fp8Recipe::kRowwise},
                                             {"blockwise", Fp8Recipe::kBlockwise}};
  return names;
}

Fp8Tiling fp8_tiling(Fp8Recipe recipe) {
  constexpr int64_t kEdge = kFp8TileEdge;
  constexpr Fp8Tile kWhole{0, 0}, kEachRow{1, 0}, kEachColumn{0, 1};
  switch (recipe) {
    case Fp8Recipe::kTensorwise:
      return {kWhole, kWhole, kWhole, kWhole, kWhole, kWhole};
    case Fp8Recipe::kRowwise:
      return {kEachRow, kEachRow, kEachRow, kEachColumn, kEachColumn, kEachColumn};
    case Fp8Recipe::kBlockwise:
      return {{1, kEdge}, {kEdge, kEdge}, {1, kEdge}, {kEdge, kEdge}, {kEdge, 1}, {kEdge, 1}};
    case Fp8Recipe::kNone:
      break;
  }
  throw std::invalid_argument("fp8_tiling: train.fp8 = none has no tiling");
}

Fp8Recipe experts_recipe(Fp8Recipe recipe, bool grouped) {
  return grouped && recipe == Fp8Recipe::kBlockwise ? Fp8Recipe::kRowwise : recipe;
}

}  // namespace dstrain
