// The pieces of TensorBoard event files against published values; the whole file is decoded back
// by an independent reader in the end-to-end tests (tests/e2e/test_tensorboard.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "dstrain/core/crc32c.h"
#include "dstrain/report/event_file.h"
#include "dstrain/report/tensorboard.h"

using namespace dstrain;

TEST(Crc32c, MatchesPublishedCheckValues) {
  // The CRC catalogue's check value of CRC-32/ISCSI, and RFC 3720's test vectors (B.4).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
}

TEST(Crc32c, MaskRotatesAndAddsTensorFlowsConstant) {
  // crc32c("123456789") = 0xE3069283; rotated right by 15 bits: 0x2507C60D; + 0xA282EAD8.
  EXPECT_EQ(masked_crc32c("123456789", 9), 0x2507C60Du + 0xA282EAD8u);
}

TEST(Protobuf, VarintsAsInTheProtobufDocumentation) {
  std::string out;
  protobuf::append_varint(out, 150);  // the encoding guide's example: 96 01
  EXPECT_EQ(out, std::string("\x96\x01", 2));
  out.clear();
  protobuf::append_varint(out, 1);
  protobuf::append_varint(out, 300);  // ac 02
  EXPECT_EQ(out, std::string("\x01\xac\x02", 3));
  out.clear();
  protobuf::append_bytes_field(out, 2, "testing");  // 12 07 74 65 73 74 69 6e 67
  EXPECT_EQ(out, std::string("\x12\x07testing", 9));
}

TEST(EventFile, RecordFramingCarriesLengthAndBothChecksums) {
  const std::string data = "some event bytes";
  const std::string record = tfrecord_frame(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(record[i]);
  EXPECT_EQ(length, data.size());
  auto u32_at = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(record[at + i]);
    return v;
  };
  EXPECT_EQ(u32_at(8), masked_crc32c(record.data(), 8));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(u32_at(12 + data.size()), masked_crc32c(data.data(), data.size()));
}

TEST(EventFile, ScalarEventEncodesEveryField) {
  const std::string event = encode_scalar_event(0.5, 7, {{"train/loss", 2.5f}});
  // wall_time: field 1, fixed64 (tag 0x09), 0.5 little-endian.
  ASSERT_GE(event.size(), 9u);
  EXPECT_EQ(static_cast<unsigned char>(event[0]), 0x09);
  double wall_time;
  std::memcpy(&wall_time, event.data() + 1, 8);
  EXPECT_EQ(wall_time, 0.5);
  // step: field 2, varint (tag 0x10) 7; summary: field 5 (0x2a), its length, Value (0x0a), ...
  EXPECT_EQ(event.substr(9, 2), std::string("\x10\x07", 2));
  EXPECT_EQ(static_cast<unsigned char>(event[11]), 0x2a);
  const std::string value = std::string("\x0a\x0atrain/loss", 12) + "\x15" + std::string("\x00\x00\x20\x40", 4);
  EXPECT_EQ(static_cast<size_t>(event[12]), 2 + value.size());
  EXPECT_EQ(event.substr(13), std::string("\x0a", 1) + static_cast<char>(value.size()) + value);
}

TEST(TensorBoard, TagsGroupMetricsAndSkipTheStep) {
  EXPECT_EQ(tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(tensorboard_tag("eval_loss"), "eval/loss");
  EXPECT_EQ(tensorboard_tag("mfu"), "perf/mfu");
  EXPECT_EQ(tensorboard_tag("step"), "");
  EXPECT_EQ(tensorboard_tag("some_new_metric"), "some_new_metric");
}
