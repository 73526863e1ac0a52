// RawTensorChunk reads a serialized TensorChunk cut into slices anywhere: every field but data
// as protobuf would parse it, data in place (no copy), malformed bytes rejected naming "chunk".
#include "server/raw_tensor_chunk.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

v1::TensorChunk Sample(std::string data) {
  v1::TensorChunk c;
  c.set_session_id("s1");
  c.set_kind(v1::VALUE);
  c.set_layer(3);
  c.set_dtype("BF16");
  c.add_shape(2);
  c.add_shape(-1);
  c.set_tp_size(2);
  c.set_batch(7);
  c.set_sequence(9);
  c.set_producer_id("p");
  c.set_data(std::move(data));
  return c;
}

// `wire` cut at the given offsets, as gRPC would hand it over.
grpc::ByteBuffer Cut(const std::string& wire, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t start = 0;
  cuts.push_back(wire.size());
  for (size_t cut : cuts) {
    slices.emplace_back(wire.data() + start, cut - start);
    start = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Gathered(const ByteSpans& data) {
  std::string out;
  for (absl::Span<const uint8_t> p : data.pieces()) out.append(p.begin(), p.end());
  return out;
}

TEST(RawTensorChunkTest, ParsesEveryCutLikeProtobuf) {
  std::string payload(300, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  const v1::TensorChunk sent = Sample(payload);
  const std::string wire = sent.SerializeAsString();
  v1::TensorChunk header = sent;
  header.clear_data();
  for (size_t cut = 1; cut < wire.size(); cut += 5) {
    RawTensorChunk raw;
    ASSERT_TRUE(raw.Parse(Cut(wire, {cut, std::min(wire.size() - 1, cut + 3)})).ok()) << cut;
    EXPECT_EQ(raw.header().SerializeAsString(), header.SerializeAsString()) << cut;
    EXPECT_EQ(raw.data().size(), payload.size());
    EXPECT_EQ(Gathered(raw.data()), payload) << cut;
  }
}

TEST(RawTensorChunkTest, DataFirstUnknownFieldsAndTheLastDataWins) {
  v1::TensorChunk first;
  first.set_data("old");
  v1::TensorChunk rest = Sample("new-bytes");
  std::string wire = first.SerializeAsString() + rest.SerializeAsString();
  wire += std::string("\xa8\x01\x05", 3);  // unknown field 21, varint 5
  RawTensorChunk raw;
  ASSERT_TRUE(raw.Parse(Cut(wire, {2, 9})).ok());
  EXPECT_EQ(Gathered(raw.data()), "new-bytes");
  EXPECT_EQ(raw.header().sequence(), 9u);
  v1::TensorChunk merged;
  ASSERT_TRUE(merged.ParseFromString(wire));
  merged.clear_data();
  EXPECT_EQ(raw.header().SerializeAsString(), merged.SerializeAsString());
}

TEST(RawTensorChunkTest, EmptyMessageHasNoData) {
  RawTensorChunk raw;
  ASSERT_TRUE(raw.Parse(Cut("", {})).ok());
  EXPECT_EQ(raw.data().size(), 0u);
  EXPECT_EQ(raw.header().session_id(), "");
  ASSERT_TRUE(raw.Parse(grpc::ByteBuffer()).ok());
  EXPECT_EQ(raw.data().size(), 0u);
}

TEST(RawTensorChunkTest, MalformedBytesAreRejectedNamingChunk) {
  const std::string wire = Sample("abcdef").SerializeAsString();
  const std::vector<std::string> bad = {
      wire.substr(0, wire.size() - 2),  // data shorter than its length
      std::string("\x7a\x05" "ab", 4),  // field 15 length 5, 2 bytes
      std::string("\x0b\x0c", 2),       // group wire type
      std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // 11-byte varint
      std::string("\x0a\x02\xff\xfe", 4),  // session_id not UTF-8
  };
  for (const std::string& bytes : bad) {
    RawTensorChunk raw;
    const absl::Status s = raw.Parse(Cut(bytes, {1}));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("chunk: not a valid caliper.v1.TensorChunk"));
    EXPECT_EQ(raw.data().size(), 0u);
  }
}

}  // namespace
}  // namespace caliper
