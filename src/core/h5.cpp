#include "dstrain/core/h5.h"

#include <atomic>

#include <vector>

namespace dstrain::h5 {

std::recursive_mutex& h5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string last_error_message() {
  std::string message;
  auto visit = [](unsigned, const H5E_error2_t* entry, void* data) -> herr_t {
    // Keep the outermost description of the failure: it is the one that reads like a sentence.
    auto* out = static_cast<std::string*>(data);
    if (out->empty() && entry->desc) *out = entry->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, visit, &message);
  H5Eclear2(H5E_DEFAULT);
  return message;
}

void check(herr_t status, ExitCode code, const std::string& context) {
  if (status < 0) {
    std::string detail = last_error_message();
    throw Error(code, context + (detail.empty() ? "" : ": " + detail));
  }
}

hid_t check_id(hid_t id, ExitCode code, const std::string& context) {
  check(id < 0 ? -1 : 0, code, context);
  return id;
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    closer_ = other.closer_;
    other.id_ = -1;
  }
  return *this;
}

namespace {
std::atomic<bool> unclosable_file{false};
}  // namespace

void note_unclosable_file() { unclosable_file = true; }
bool holds_unclosable_file() { return unclosable_file; }

void Handle::reset() {
  // A close failure here has nobody left to tell, but a file HDF5 could not close must be noted.
  if (id_ >= 0 && closer_ && closer_(id_) < 0 && closer_ == &H5Fclose) note_unclosable_file();
  id_ = -1;
}

bool is_hdf5_file(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  quiet_errors();
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) last_error_message();  // clears what a file of another kind left on the error stack
  return is_hdf5 > 0;
}

bool has_link(hid_t location, const std::string& name) {
  return H5Lexists(location, name.c_str(), H5P_DEFAULT) > 0;
}

void write_attribute_u64(hid_t object, const std::string& name, uint64_t value, ExitCode code) {
  Handle space(check_id(H5Screate(H5S_SCALAR), code, "H5Screate"), H5Sclose);
  Handle attr(check_id(H5Acreate2(object, name.c_str(), H5T_STD_U64LE, space.get(), H5P_DEFAULT,
                                  H5P_DEFAULT),
                       code, "creating attribute " + name),
              H5Aclose);
  check(H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value), code, "writing attribute " + name);
}

uint64_t read_attribute_u64(hid_t object, const std::string& name, ExitCode code,
                            const std::string& context) {
  if (H5Aexists(object, name.c_str()) <= 0)
    throw Error(code, context + ": attribute '" + name + "' is missing");
  Handle attr(check_id(H5Aopen(object, name.c_str(), H5P_DEFAULT), code, context + ": " + name),
              H5Aclose);
  uint64_t value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_UINT64, &value), code,
        context + ": attribute '" + name + "' is not an integer");
  return value;
}

void write_attribute_f64(hid_t object, const std::string& name, double value, ExitCode code) {
  Handle space(check_id(H5Screate(H5S_SCALAR), code, "H5Screate"), H5Sclose);
  Handle attr(check_id(H5Acreate2(object, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       code, "creating attribute " + name),
              H5Aclose);
  check(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), code, "writing attribute " + name);
}

double read_attribute_f64(hid_t object, const std::string& name, ExitCode code, const std::string& context) {
  if (H5Aexists(object, name.c_str()) <= 0)
    throw Error(code, context + ": attribute '" + name + "' is missing");
  Handle attr(check_id(H5Aopen(object, name.c_str(), H5P_DEFAULT), code, context + ": " + name), H5Aclose);
  double value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value), code, context + ": attribute '" + name + "' is not a number");
  return value;
}

void write_attribute_string(hid_t object, const std::string& name, const std::string& value,
                            ExitCode code) {
  Handle type(check_id(H5Tcopy(H5T_C_S1), code, "H5Tcopy"), H5Tclose);
  check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), code, "H5Tset_size");
  Handle space(check_id(H5Screate(H5S_SCALAR), code, "H5Screate"), H5Sclose);
  Handle attr(check_id(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT,
                                  H5P_DEFAULT),
                       code, "creating attribute " + name),
              H5Aclose);
  check(H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.c_str()), code,
        "writing attribute " + name);
}

std::string read_attribute_string(hid_t object, const std::string& name, ExitCode code,
                                  const std::string& context) {
  if (H5Aexists(object, name.c_str()) <= 0)
    throw Error(code, context + ": attribute '" + name + "' is missing");
  Handle attr(check_id(H5Aopen(object, name.c_str(), H5P_DEFAULT), code, context + ": " + name),
              H5Aclose);
  Handle type(check_id(H5Aget_type(attr.get()), code, context + ": " + name), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
    throw Error(code, context + ": attribute '" + name + "' is not a fixed-length string");
  size_t size = H5Tget_size(type.get());
  std::vector<char> buffer(size + 1, '\0');
  check(H5Aread(attr.get(), type.get(), buffer.data()), code, context + ": reading " + name);
  return std::string(buffer.data());
}

}  // namespace dstrain::h5
