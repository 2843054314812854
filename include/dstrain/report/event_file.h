// TensorBoard event files, written without TensorFlow or libprotobuf: a TFRecord file (each record
// framed by its length and masked CRC-32Cs) of tensorflow.Event protocol buffers, encoded by hand
// with the few fields scalars need. The encoding, field by field (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto):
//
//   Event       1: wall_time (double, seconds since the epoch)   2: step (int64, varint)
//               3: file_version (string, "brain.Event:2": the first record of every file)
//               5: summary (Summary)                             7: session_log (SessionLog)
//   Summary     1: value (repeated Value)
//   Value       1: tag (string)                                  2: simple_value (float)
//   SessionLog  1: status (enum: 1 = START)
//
//   record      uint64 length (little-endian), uint32 masked_crc32c(length bytes),
//               length bytes of data, uint32 masked_crc32c(data)
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dstrain {

class EventFileWriter {
 public:
  // Creates `dir`/events.out.tfevents.<seconds>.<host>.<pid> (the name TensorBoard looks for)
  // and writes the file-version record. Throws Error(kUsage) naming run.dir when it cannot.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event whose Summary holds every (tag, value) as a simple_value; flushed, so that
  // TensorBoard shows a running job's progress.
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  // A SessionLog START at `step`: TensorBoard discards what earlier files recorded at this step
  // and later, as a run resumed from a checkpoint writes those steps again.
  void write_restart(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// The encodings, exposed for tests.
namespace protobuf {
void append_varint(std::string& out, uint64_t value);
void append_tag(std::string& out, int field, int wire_type);
void append_bytes_field(std::string& out, int field, const std::string& bytes);
}  // namespace protobuf
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& scalars);
std::string tfrecord_frame(const std::string& data);

}  // namespace dstrain
