#include "dstrain/ckpt/parameter_file.h"

#include <algorithm>
#include <cstdio>

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

void write_parameter_file(const std::string& path, const NamedTensors& params) {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::quiet_errors();
  const std::string tmp = path + ".tmp";
  {
    h5::Handle file(h5::check_id(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), kCode,
                                 "cannot create " + tmp),
                    H5Fclose);
    h5::Handle group(h5::check_id(H5Gcreate2(file.get(), "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), kCode,
                                  tmp + ": creating /model"),
                     H5Gclose);
    for (const auto& [name, tensor] : params) {
      torch::Tensor values = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      std::vector<hsize_t> dims(values.sizes().begin(), values.sizes().end());
      h5::Handle space(h5::check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), kCode,
                                    "H5Screate_simple"),
                       H5Sclose);
      h5::Handle dataset(h5::check_id(H5Dcreate2(group.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                                 H5P_DEFAULT, H5P_DEFAULT),
                                      kCode, tmp + ": creating /model/" + name),
                         H5Dclose);
      h5::check(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data_ptr<float>()),
                kCode, tmp + ": writing /model/" + name);
    }
    h5::check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), kCode, tmp + ": flushing");
  }
  std::string why;
  if (!files::rename(tmp, path, &why)) {
    std::remove(tmp.c_str());
    throw Error(kCode, "cannot rename " + tmp + " to " + path + ": " + why);
  }
}

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
