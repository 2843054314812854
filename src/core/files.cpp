#include "dstrain/core/files.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dstrain::files {

bool is_regular_file(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::vector<std::string> directory_entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) names.push_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

int64_t available_bytes(const std::string& path) {
  struct statvfs info;
  if (::statvfs(path.c_str(), &info) != 0) return -1;
  return static_cast<int64_t>(info.f_bavail) * static_cast<int64_t>(info.f_frsize);
}

std::string full_disk_note(const std::string& path) {
  const std::string dir = parent(path).empty() ? "." : parent(path);
  const int64_t free_bytes = available_bytes(dir);
  if (free_bytes < 0 || free_bytes >= (int64_t{1} << 20)) return "";
  return " (No space left on device: the file system of " + dir + " had " + std::to_string(free_bytes) +
         " bytes left)";
}

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat first, second;
  return ::stat(a.c_str(), &first) == 0 && ::stat(b.c_str(), &second) == 0 && first.st_dev == second.st_dev &&
         first.st_ino == second.st_ino;
}

bool make_directories(const std::string& path, std::string* error, std::vector<std::string>* made) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty()) {
      if (::mkdir(prefix.c_str(), 0777) == 0) {
        if (made) made->push_back(prefix);
      } else if (errno != EEXIST) {
        *error = prefix + ": " + std::strerror(errno);
        return false;
      }
    }
    if (slash == std::string::npos) break;
  }
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    *error = path + ": not a directory";
    return false;
  }
  return true;
}

bool can_write_in(const std::string& dir, std::string* error) {
  if (::access(dir.c_str(), W_OK | X_OK) == 0) return true;
  *error = std::strerror(errno);
  return false;
}

bool make_parent_directories(const std::string& path, std::string* error, std::vector<std::string>* made) {
  const std::string dir = parent(path);
  return dir.empty() || make_directories(dir, error, made);
}

void remove_empty_directories(const std::vector<std::string>& made) {
  // rmdir fails on a directory that has anything in it, which is what keeps this safe.
  for (auto dir = made.rbegin(); dir != made.rend(); ++dir) ::rmdir(dir->c_str());
}

void remove_tree(const std::string& path) {
  // Children before their directory (FTW_DEPTH), links themselves rather than their targets.
  ::nftw(
      path.c_str(), [](const char* entry, const struct stat*, int, struct FTW*) { return ::remove(entry), 0; }, 16,
      FTW_DEPTH | FTW_PHYS);
}

bool rename(const std::string& from, const std::string& to, std::string* error) {
  if (std::rename(from.c_str(), to.c_str()) == 0) return true;
  *error = std::strerror(errno);
  return false;
}

std::string temp_directory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

std::string parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

namespace {
std::string file_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

std::string stem(const std::string& path) {
  const std::string name = file_name(path);
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

std::string extension(const std::string& path) {
  const std::string name = file_name(path);
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? "" : name.substr(dot);
}

}  // namespace dstrain::files
