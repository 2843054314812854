#include "dstrain/ckpt/parameter_file.h"

#include <algorithm>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/h5.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* names) {
  static_cast<std::vector<std::string>*>(names)->push_back(name);
  return 0;
}

}  // namespace

NamedTensors read_parameter_file(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::quiet_errors();
  if (!files::is_regular_file(path)) throw Error(kCode, path + ": no such file");
  h5::Handle file(h5::check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), kCode,
                               path + ": not a readable HDF5 file"),
                  H5Fclose);
  if (!h5::has_link(file.get(), "model")) throw Error(kCode, path + ": no /model group");
  h5::Handle group(h5::check_id(H5Gopen2(file.get(), "model", H5P_DEFAULT), kCode, path + ": opening /model"),
                   H5Gclose);
  std::vector<std::string> names;
  h5::check(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names), kCode,
            path + ": listing /model");
  NamedTensors params;
  for (const std::string& name : names) {
    const std::string where = path + ": /model/" + name;
    h5::Handle dataset(h5::check_id(H5Dopen2(group.get(), name.c_str(), H5P_DEFAULT), kCode, where), H5Dclose);
    h5::Handle space(h5::check_id(H5Dget_space(dataset.get()), kCode, where), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) throw Error(kCode, where + ": unreadable shape");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    h5::check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), kCode, where);
    torch::Tensor values = torch::empty(std::vector<int64_t>(dims.begin(), dims.end()), torch::kFloat32);
    h5::check(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data_ptr<float>()),
              kCode, where + ": reading");
    params.emplace_back(name, values);
  }
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return params;
}

}  // namespace dstrain
