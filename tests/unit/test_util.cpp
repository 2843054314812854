#include "test_util.h"

#include <fstream>
#include <random>

namespace dstrain::test {

TempDir::TempDir() {
  std::random_device entropy;
  dir_ = std::filesystem::temp_directory_path() / ("dstrain-test-" + std::to_string(entropy()));
  std::filesystem::create_directories(dir_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
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
