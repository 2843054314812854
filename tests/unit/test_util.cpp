#include "test_util.h"

#include <fstream>

#include "dstrain/core/files.h"
#include <random>

namespace dstrain::test {

TempDir::TempDir() {
  std::random_device entropy;
  dir_ = files::temp_directory() + "/dstrain-test-" + std::to_string(entropy());
  std::string why;
  if (!files::make_directories(dir_, &why)) ADD_FAILURE() << why;
}

TempDir::~TempDir() {
  files::remove_tree(dir_);
}

void TempDir::write(const std::string& name, const std::string& content) const {
  std::ofstream out(path(name), std::ios::binary);
  out << content;
}

void expect_error(const std::function<void()>& body, ExitCode code,
                  std::initializer_list<std::string> parts) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    return;
  }
  ADD_FAILURE() << "no error thrown";
}

}  // namespace dstrain::test
