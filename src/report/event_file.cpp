#include "dstrain/report/event_file.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"

namespace dstrain {
namespace protobuf {

// Wire types of the protobuf encoding.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void append_tag(std::string& out, int field, int wire_type) {
  append_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void append_bytes_field(std::string& out, int field, const std::string& bytes) {
  append_tag(out, field, kLengthDelimited);
  append_varint(out, bytes.size());
  out += bytes;
}

// Fixed-width fields are little-endian whatever the host.
template <typename Unsigned>
void append_little_endian(std::string& out, Unsigned value) {
  for (size_t i = 0; i < sizeof(Unsigned); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void append_double_field(std::string& out, int field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  append_tag(out, field, kFixed64);
  append_little_endian(out, bits);
}

void append_float_field(std::string& out, int field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  append_tag(out, field, kFixed32);
  append_little_endian(out, bits);
}

void append_int64_field(std::string& out, int field, int64_t value) {
  append_tag(out, field, kVarint);
  append_varint(out, static_cast<uint64_t>(value));  // negative int64: ten bytes, as protobuf does
}

}  // namespace protobuf

namespace {

// Field numbers (event.proto, summary.proto).
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr int kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;
constexpr int kSessionLogStatus = 1, kSessionLogStart = 1;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  protobuf::append_double_field(event, kEventWallTime, wall_time);
  protobuf::append_int64_field(event, kEventStep, step);
  return event;
}

}  // namespace

std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string encoded;
    protobuf::append_bytes_field(encoded, kValueTag, tag);
    protobuf::append_float_field(encoded, kValueSimpleValue, value);
    protobuf::append_bytes_field(summary, kSummaryValue, encoded);
  }
  std::string event = event_header(wall_time, step);
  protobuf::append_bytes_field(event, kEventSummary, summary);
  return event;
}

std::string tfrecord_frame(const std::string& data) {
  std::string record;
  protobuf::append_little_endian(record, static_cast<uint64_t>(data.size()));
  protobuf::append_little_endian(record, masked_crc32c(record.data(), 8));
  record += data;
  protobuf::append_little_endian(record, masked_crc32c(data.data(), data.size()));
  return record;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const double now = now_seconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host + "." +
          std::to_string(static_cast<long long>(getpid()));
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw config_error("run.dir", dir, "cannot create the TensorBoard event file " + path_);
  std::string event = event_header(now, 0);
  protobuf::append_bytes_field(event, kEventFileVersion, "brain.Event:2");
  write_record(event);
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  write_record(encode_scalar_event(now_seconds(), step, scalars));
}

void EventFileWriter::write_restart(int64_t step) {
  std::string session_log;
  protobuf::append_tag(session_log, kSessionLogStatus, protobuf::kVarint);
  protobuf::append_varint(session_log, kSessionLogStart);
  std::string event = event_header(now_seconds(), step);
  protobuf::append_bytes_field(event, kEventSessionLog, session_log);
  write_record(event);
}

void EventFileWriter::write_record(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw config_error("run.dir", path_, "cannot write the TensorBoard event file (disk full?)");
}

}  // namespace dstrain
