#include "core/formats/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fault_injection_env.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

std::string LengthPrefixed(const std::string& header, const std::string& data = "") {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Error message of parsing `header` followed by `data`.
std::string ParseError(const std::string& header, const std::string& data = "") {
  auto file = SafetensorsFile::FromBytes(LengthPrefixed(header, data));
  EXPECT_FALSE(file.ok()) << header;
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  return std::string(file.status().message());
}

TEST(SafetensorsTest, RoundTripKeepsNamesShapesBytesAndMetadata) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("a.k_scale", "F32", {}, FloatBytes({0.5f})).ok());
  ASSERT_TRUE(writer.Add("b.weight", "BF16", {2, 3}, std::string(12, '\x3f')).ok());
  ASSERT_TRUE(writer.Add("c.global", "F32", {1}, FloatBytes({2688.0f})).ok());
  ASSERT_TRUE(writer.Add("d.packed", "U8", {3}, std::string("\x01\x02\x03", 3)).ok());
  ASSERT_TRUE(writer.Add("e.wide", "F64", {2}, std::string(16, '\x11')).ok());
  writer.SetMetadata("format", "pt");
  const std::string bytes = writer.Serialize();

  auto file = SafetensorsFile::FromBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  ASSERT_EQ((*file)->tensors().size(), 5u);
  // Widest dtype first, then insertion order; contiguous from 0.
  std::vector<std::string> names;
  for (const auto& entry : (*file)->tensors()) names.push_back(entry.name);
  EXPECT_EQ(names, (std::vector<std::string>{"e.wide", "a.k_scale", "c.global", "b.weight",
                                             "d.packed"}));
  const SafetensorsEntry* scale = (*file)->Find("a.k_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_TRUE(scale->shape.empty());
  EXPECT_EQ(scale->begin, 16u);
  EXPECT_EQ(scale->end, 20u);
  float value;
  std::memcpy(&value, (*file)->Data(*scale).data(), 4);
  EXPECT_EQ(value, 0.5f);
  const SafetensorsEntry* global = (*file)->Find("c.global");
  std::memcpy(&value, (*file)->Data(*global).data(), 4);
  EXPECT_EQ(value, 2688.0f);
  const SafetensorsEntry* packed = (*file)->Find("d.packed");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->Data(*packed).data()), 3),
            std::string("\x01\x02\x03", 3));
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  // Header length is a multiple of 8, so the data section is 8-byte aligned.
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + 16 + 4 + 4 + 12 + 3);
}

TEST(SafetensorsTest, FindLocatesEveryNameAndNothingElse) {
  // Names written in descending order and of mixed widths, so data order, insertion order and
  // name order all differ.
  SafetensorsWriter writer;
  constexpr int kTensors = 300;
  for (int i = kTensors - 1; i >= 0; --i) {
    const std::string dtype = i % 3 == 0 ? "F32" : "U8";
    const std::string bytes = dtype == "F32" ? FloatBytes({static_cast<float>(i)})
                                             : std::string(1, static_cast<char>(i % 251));
    ASSERT_TRUE(writer.Add(absl::StrCat("layers.", i, ".x"), dtype, {1}, bytes).ok());
  }
  auto file = SafetensorsFile::FromBytes(writer.Serialize());
  ASSERT_TRUE(file.ok()) << file.status();
  for (int i = 0; i < kTensors; ++i) {
    const std::string name = absl::StrCat("layers.", i, ".x");
    const SafetensorsEntry* entry = (*file)->Find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->name, name);
    if (i % 3 == 0) {
      float value;
      std::memcpy(&value, (*file)->Data(*entry).data(), 4);
      EXPECT_EQ(value, static_cast<float>(i)) << name;
    } else {
      EXPECT_EQ((*file)->Data(*entry)[0], static_cast<uint8_t>(i % 251)) << name;
    }
  }
  EXPECT_EQ((*file)->Find("layers.1"), nullptr);        // a prefix of stored names
  EXPECT_EQ((*file)->Find("layers.1.x.y"), nullptr);    // an extension of one
  EXPECT_EQ((*file)->Find(""), nullptr);
  EXPECT_EQ((*file)->Find("zzz"), nullptr);              // after every name
}

TEST(SafetensorsTest, ViewOfBf16AndScalarAndRefusalOfU8) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("s", "F32", {}, FloatBytes({3.0f})).ok());
  ASSERT_TRUE(writer.Add("w", "BF16", {2, 2}, std::string(8, '\0')).ok());
  ASSERT_TRUE(writer.Add("p", "U8", {4}, std::string(4, '\0')).ok());
  auto file = SafetensorsFile::FromBytes(writer.Serialize());
  ASSERT_TRUE(file.ok()) << file.status();
  auto scalar = (*file)->View(*(*file)->Find("s"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->shape(), (std::vector<int64_t>{1}));
  EXPECT_EQ(scalar->dtype(), DType::kF32);
  auto weight = (*file)->View(*(*file)->Find("w"));
  ASSERT_TRUE(weight.ok());
  EXPECT_EQ(weight->dtype(), DType::kBF16);
  EXPECT_EQ(weight->num_elements(), 4);
  auto packed = (*file)->View(*(*file)->Find("p"));
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(packed.status().message(), HasSubstr("tensor \"p\""));
}

TEST(SafetensorsTest, EmptyFileAndEmptyTensorAreValid) {
  SafetensorsWriter empty;
  auto file = SafetensorsFile::FromBytes(empty.Serialize());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());

  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("zero", "F32", {0, 4}, "").ok());
  ASSERT_TRUE(writer.Add("one", "F32", {1}, FloatBytes({1.0f})).ok());
  file = SafetensorsFile::FromBytes(writer.Serialize());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 2u);
}

TEST(SafetensorsTest, WriterRejectsBadTensors) {
  SafetensorsWriter writer;
  absl::Status status = writer.Add("x", "F32", {2}, FloatBytes({1.0f}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"x\": 4 bytes, but shape [2] of F32 needs 8"));
  status = writer.Add("x", "F17", {1}, FloatBytes({1.0f}));
  EXPECT_THAT(status.message(), HasSubstr("unknown dtype \"F17\""));
  status = writer.Add("x", "F32", {-1}, "");
  EXPECT_THAT(status.message(), HasSubstr("negative dimension"));
  status = writer.Add("__metadata__", "F32", {1}, FloatBytes({1.0f}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer.Add("x", "F32", {1}, FloatBytes({1.0f})).ok());
  EXPECT_EQ(writer.Add("x", "F32", {1}, FloatBytes({1.0f})).code(),
            absl::StatusCode::kAlreadyExists);
  status = writer.Add("f4", "F4", {3}, "\x01");  // 12 bits is not whole bytes
  EXPECT_THAT(status.message(), HasSubstr("do not fill whole bytes"));
  EXPECT_TRUE(writer.Add("f4", "F4", {4}, "\x01\x02").ok());
}

TEST(SafetensorsTest, TruncatedAndOversizedHeaderLengths) {
  auto tiny = SafetensorsFile::FromBytes(std::string(5, '\0'));
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(tiny.status().message(), HasSubstr("too short for the 8-byte header length"));

  std::string huge(8, '\0');
  huge[5] = 0x10;  // 2^44 bytes of header
  huge += "{}";
  auto big = SafetensorsFile::FromBytes(huge);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("exceeds the 100000000 byte limit"));

  std::string longer = LengthPrefixed("{}");
  longer[0] = 40;  // says 40 bytes of header, only 2 follow
  auto truncated = SafetensorsFile::FromBytes(longer);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(),
              HasSubstr("truncated: header length 40 but only 2 bytes follow"));
}

TEST(SafetensorsTest, HeaderMustBeAJsonObject) {
  EXPECT_THAT(ParseError("[1, 2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseError(" {}"), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseError("{\"a\": "), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError("{} x"), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError("{\"t\": 3}"), HasSubstr("tensor \"t\": entry must be an object"));
}

TEST(SafetensorsTest, EveryEntryFieldIsChecked) {
  const std::string four = FloatBytes({1.0f});
  EXPECT_THAT(ParseError(R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\": dtype missing or not a string"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\": dtype missing or not a string"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "FP32", "shape": [1], "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\".dtype: unknown dtype \"FP32\""));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\": shape missing or not an array"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\": shape[0] must be a non-negative integer"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", four),
              HasSubstr("shape[0] must be a non-negative integer"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1]}})", four),
              HasSubstr("tensor \"t\": data_offsets must be an array of two"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", four),
              HasSubstr("data_offsets must be an array of two"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", four),
              HasSubstr("data_offsets must be an array of two non-negative integers"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", four),
              HasSubstr("tensor \"t\": data_offsets [4, 0] has begin > end"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", four),
              HasSubstr("tensor \"t\": data_offsets [0, 8] out of range: the data section holds 4"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", four),
              HasSubstr("tensor \"t\": 4 bytes, but shape [2] of F32 needs 8"));
  EXPECT_THAT(ParseError(R"({"t": {"dtype": "F32", "shape": [4611686018427387904, 8],
                                   "data_offsets": [0, 4]}})", four),
              HasSubstr("element count overflows"));
}

TEST(SafetensorsTest, OffsetsMustTileTheDataSection) {
  const std::string eight = FloatBytes({1.0f, 2.0f});
  EXPECT_THAT(ParseError(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight),
              HasSubstr("overlap tensor"));
  EXPECT_THAT(ParseError(R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight),
              HasSubstr("tensor \"b\" begins at 4, leaving a gap"));
  EXPECT_THAT(ParseError(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", eight),
              HasSubstr("the data section holds 8 bytes but tensors cover only 4"));
  EXPECT_THAT(ParseError(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight),
              HasSubstr("tensor \"a\" appears twice"));
}

TEST(SafetensorsTest, MetadataMustMapStringsToStrings) {
  EXPECT_THAT(ParseError(R"({"__metadata__": ["x"]})"),
              HasSubstr("__metadata__ must be an object of strings"));
  EXPECT_THAT(ParseError(R"({"__metadata__": {"format": 1}})"),
              HasSubstr("__metadata__.format must be a string"));
  auto ok = SafetensorsFile::FromBytes(LengthPrefixed(R"({"__metadata__": {"format": "pt"}})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->metadata().at("format"), "pt");
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("caliper_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsFileTest, WriteFileThenOpenMapsTheSameData) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("x", "F32", {3}, FloatBytes({1.0f, -2.0f, 448.0f})).ok());
  const std::string path = (dir_ / "out.safetensors").string();
  ASSERT_TRUE(writer.WriteFile(path).ok());
  // Nothing but the final file is left behind.
  int entries = 0;
  for (const auto& item : std::filesystem::directory_iterator(dir_)) {
    (void)item;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->origin(), path);
  auto view = (*file)->View(*(*file)->Find("x"));
  ASSERT_TRUE(view.ok());
  float values[3];
  std::memcpy(values, view->data(), sizeof(values));
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], 448.0f);
  (*file)->ReleasePages(*(*file)->Find("x"));  // harmless on a tensor smaller than a page
  std::memcpy(values, (*file)->Data(*(*file)->Find("x")).data(), sizeof(values));
  EXPECT_EQ(values[2], 448.0f);
}

TEST_F(SafetensorsFileTest, ErrorsNameTheFile) {
  const std::string missing = (dir_ / "missing.safetensors").string();
  auto none = SafetensorsFile::Open(missing);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr(missing));

  const std::string bad = (dir_ / "bad.safetensors").string();
  std::ofstream(bad, std::ios::binary)
      << LengthPrefixed(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})",
                        FloatBytes({1.0f}));
  auto file = SafetensorsFile::Open(bad);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr(bad + ": tensor \"w\": 4 bytes"));

  const std::string empty = (dir_ / "empty.safetensors").string();
  std::ofstream(empty, std::ios::binary) << "";
  file = SafetensorsFile::Open(empty);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr(empty + ": truncated"));

  auto directory = SafetensorsFile::Open(dir_.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_THAT(directory.status().message(), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsFileTest, WriteFileGoesThroughTheEnvAndKeepsTheOldFileOnFailure) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("t", "F32", {1}, std::string(4, '\0')).ok());
  const std::string path = (dir_ / "x.safetensors").string();
  ASSERT_TRUE(writer.WriteFile(path).ok());
  ASSERT_TRUE(SafetensorsFile::Open(path).ok());
  testing_util::FaultInjectionEnv env;
  env.fail_append = true;  // a full disk
  SafetensorsWriter bigger;
  ASSERT_TRUE(bigger.Add("u", "F32", {2}, std::string(8, '\0')).ok());
  absl::Status status = bigger.WriteFile(path, &env);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsIoError(status));
  auto kept = SafetensorsFile::Open(path);  // the old file, whole
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ((*kept)->tensors().size(), 1u);
  for (const auto& item : std::filesystem::directory_iterator(dir_)) {
    EXPECT_THAT(item.path().filename().string(), ::testing::Not(HasSubstr(std::string(kTempFileMarker))));
  }
}

TEST_F(SafetensorsFileTest, OpenErrorsAreIoErrors) {
  auto missing = SafetensorsFile::Open((dir_ / "absent.safetensors").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsIoError(missing.status()));
}

}  // namespace
}  // namespace caliper
