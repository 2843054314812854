// The few file-system operations dstrain needs, on POSIX calls rather than std::filesystem:
// LibTorch 2.x wheels export their own statically linked copy of std::filesystem (pytorch/pytorch
// issue 133437), which the dynamic linker may bind a program's calls to, and with which
// directory iteration crashes. These functions never throw; callers turn failures into errors
// that name the file and what it was for.
#pragma once

#include <string>
#include <vector>

namespace dstrain::files {

bool is_regular_file(const std::string& path);
bool is_directory(const std::string& path);
bool exists(const std::string& path);
// Bytes an unprivileged writer may still write on the file system holding `path` (-1: unknown).
int64_t available_bytes(const std::string& path);
// After a write into the file `path` failed: " (No space left on device: the file system of DIR
// had N bytes left)" when that file system is full (under 1 MiB left), else "". HDF5's own message
// for such a write says only that it failed.
std::string full_disk_note(const std::string& path);
// Both name one existing file (through links or other spellings of the path).
bool same_file(const std::string& a, const std::string& b);
// The names in a directory ("." and ".." included); empty when it cannot be read.
std::vector<std::string> directory_entries(const std::string& dir);
// Creates `path` and its missing parents; on failure returns false with the reason in `error`.
// `made`, when given, gets the directories this call created appended, outermost first.
bool make_directories(const std::string& path, std::string* error, std::vector<std::string>* made = nullptr);
// Whether files can be made in directory `dir` (a read-only file system, say, makes none); when
// not, the reason in `error`.
bool can_write_in(const std::string& dir, std::string* error);
// make_directories for the directory that file `path` goes in (nothing to do when it names none).
bool make_parent_directories(const std::string& path, std::string* error, std::vector<std::string>* made = nullptr);
// Removes those of `made` (as make_directories lists them) that are empty, innermost first: what
// a command that failed had created and not used, so that it leaves nothing behind.
void remove_empty_directories(const std::vector<std::string>& made);
// Removes a file or a whole directory tree, as far as it can.
void remove_tree(const std::string& path);
// Atomic within one file system; on failure returns false with the reason in `error`.
bool rename(const std::string& from, const std::string& to, std::string* error);
// $TMPDIR, or /tmp.
std::string temp_directory();

// "a/b/c.jsonl" → "a/b", "c", ".jsonl" (the extension keeps its dot; none: "").
std::string parent(const std::string& path);
std::string stem(const std::string& path);
std::string extension(const std::string& path);

}  // namespace dstrain::files
