// Small RAII wrappers over the HDF5 C API (parallel builds have no C++ API) with every status
// checked. HDF5 as Debian builds it with MPI is not thread-safe: every call made while another
// thread may also use HDF5 holds h5_mutex().
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>

#include "dstrain/core/error.h"

namespace dstrain::h5 {

std::recursive_mutex& h5_mutex();

// Silences HDF5's own error-stack printing; our messages say what failed instead.
void quiet_errors();
// HDF5 (1.10) cannot recover a file whose flush failed (a full disk): it stays open, and closing
// the library with it (at exit, or in MPI_Finalize) crashes. Whoever abandons such a file notes it;
// the process then ends without closing HDF5 or finalizing MPI (see finalize_mpi).
void note_unclosable_file();
bool holds_unclosable_file();

// The innermost message on HDF5's error stack ("unable to open file", ...), or "".
std::string last_error_message();

// Throws Error(code, "<context>: <HDF5's message>") when `status` is negative.
void check(herr_t status, ExitCode code, const std::string& context);
hid_t check_id(hid_t id, ExitCode code, const std::string& context);

// Owns an hid_t and closes it with the right H5*close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  void reset();
  // Forgets the identifier without closing it (it was closed, its status checked, by the caller).
  void release() { id_ = -1; }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

bool has_link(hid_t location, const std::string& name);
// An HDF5 file by its signature (false for other files and for paths that cannot be read).
bool is_hdf5_file(const std::string& path);
void write_attribute_u64(hid_t object, const std::string& name, uint64_t value, ExitCode code);
uint64_t read_attribute_u64(hid_t object, const std::string& name, ExitCode code,
                            const std::string& context);
void write_attribute_f64(hid_t object, const std::string& name, double value, ExitCode code);
double read_attribute_f64(hid_t object, const std::string& name, ExitCode code, const std::string& context);
void write_attribute_string(hid_t object, const std::string& name, const std::string& value,
                            ExitCode code);
std::string read_attribute_string(hid_t object, const std::string& name, ExitCode code,
                                  const std::string& context);

}  // namespace dstrain::h5
