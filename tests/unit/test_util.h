// Helpers shared by the unit tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "dstrain/core/error.h"

namespace dstrain::test {

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  void write(const std::string& name, const std::string& content) const;

 private:
  std::string dir_;
};

// Runs `body`, expects an Error with `code` whose message contains every one of `parts`.
void expect_error(const std::function<void()>& body, ExitCode code,
                  std::initializer_list<std::string> parts);

}  // namespace dstrain::test
