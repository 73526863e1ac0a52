#include "core/state/state_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/state/crc32c.h"
#include "tests/support/state_test_util.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using testing_util::FaultInjectionEnv;
using testing_util::SlurpFile;
using testing_util::SpitFile;
using testing_util::TempDir;

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 B.4 and the usual check value.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  // Extending in pieces equals one pass.
  uint32_t crc = Crc32cExtend(0, "12345", 5);
  EXPECT_EQ(Crc32cExtend(crc, "6789", 4), 0xE3069283u);
}

TEST(StateFileTest, FrameLayoutIsExplicit) {
  std::string framed = FrameStatePayload("abc");
  ASSERT_EQ(framed.size(), kStateFileHeaderSize + 3);
  EXPECT_EQ(framed.substr(0, 8), "CALIPER1");
  EXPECT_EQ(framed.substr(8, 4), std::string("\x01\x00\x00\x00", 4));   // version 1, LE
  EXPECT_EQ(framed.substr(16, 8), std::string("\x03\0\0\0\0\0\0\0", 8));  // length 3, LE
  uint32_t crc = Crc32c("abc");
  EXPECT_EQ(static_cast<uint8_t>(framed[24]), crc & 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(framed[27]), crc >> 24);
  EXPECT_EQ(framed.substr(32), "abc");
}

TEST(StateFileTest, WriteThenReadRoundTrips) {
  TempDir dir;
  std::string payload("binary\0payload\xff", 15);
  ASSERT_TRUE(WriteStateFileAtomic(dir.File("s.state"), payload).ok());
  auto read = ReadStateFile(dir.File("s.state"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, payload);
  // Overwrite replaces; empty payload is legal.
  ASSERT_TRUE(WriteStateFileAtomic(dir.File("s.state"), "").ok());
  read = ReadStateFile(dir.File("s.state"));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "");
  // No temp file remains after success.
  auto names = Env::Default()->ListDir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"s.state"});
}

TEST(StateFileTest, MissingFileIsNotFound) {
  TempDir dir;
  auto read = ReadStateFile(dir.File("absent.state"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("absent.state"), std::string::npos);
}

TEST(StateFileTest, EveryTruncationIsDataLoss) {
  TempDir dir;
  const std::string path = dir.File("t.state");
  ASSERT_TRUE(WriteStateFileAtomic(path, "0123456789abcdef").ok());
  const std::string good = SlurpFile(path);
  for (size_t keep = 0; keep < good.size(); ++keep) {
    SpitFile(path, good.substr(0, keep));
    auto read = ReadStateFile(path);
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << "keep=" << keep;
    EXPECT_NE(read.status().message().find(path), std::string::npos);
    EXPECT_NE(read.status().message().find("truncated"), std::string::npos) << read.status();
  }
  SpitFile(path, good + "x");
  auto read = ReadStateFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("unexpected bytes"), std::string::npos);
}

TEST(StateFileTest, EverySingleBitFlipIsDataLoss) {
  TempDir dir;
  const std::string path = dir.File("f.state");
  ASSERT_TRUE(WriteStateFileAtomic(path, "observer state 0123").ok());
  const std::string good = SlurpFile(path);
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      auto read = UnframeStatePayload(bad, path);  // in memory: 440 cases stay fast
      ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
          << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(StateFileTest, NamesTheDefect) {
  std::string good = FrameStatePayload("payload");
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_NE(UnframeStatePayload(bad_magic, "f").status().message().find("bad magic"),
            std::string::npos);
  std::string bad_payload = good;
  bad_payload.back() ^= 1;
  EXPECT_NE(UnframeStatePayload(bad_payload, "f").status().message().find("payload checksum"),
            std::string::npos);
  std::string bad_header = good;
  bad_header[20] ^= 1;  // inside the length field
  EXPECT_NE(UnframeStatePayload(bad_header, "f").status().message().find("header checksum"),
            std::string::npos);
  // A future version with a valid header checksum is refused by version, not by checksum.
  std::string future = good.substr(0, 28);
  future[8] = 2;
  uint32_t crc = Crc32c(future);
  for (int i = 0; i < 4; ++i) future.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  future += "payload";
  auto read = UnframeStatePayload(future, "f");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("format version 2"), std::string::npos);
}

TEST(StateFileTest, InjectedFailuresLeaveOldFileAndNoTemp) {
  TempDir dir;
  const std::string path = dir.File("s.state");
  ASSERT_TRUE(WriteStateFileAtomic(path, "old").ok());
  for (int step = 0; step < 5; ++step) {
    FaultInjectionEnv env;
    env.fail_open = step == 0;
    env.fail_append = step == 1;
    env.fail_sync = step == 2;
    env.fail_close = step == 3;
    env.fail_rename = step == 4;
    absl::Status status = WriteStateFileAtomic(path, "new", &env);
    ASSERT_FALSE(status.ok()) << "step " << step;
    EXPECT_NE(status.message().find(path), std::string::npos) << status;
    EXPECT_NE(status.message().find("injected"), std::string::npos) << status;
    auto read = ReadStateFile(path);
    ASSERT_TRUE(read.ok());
    EXPECT_EQ(*read, "old") << "step " << step;
    auto names = Env::Default()->ListDir(dir.path());
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(*names, std::vector<std::string>{"s.state"}) << "step " << step;
  }
}

TEST(StateFileTest, DirSyncFailureIsReported) {
  TempDir dir;
  FaultInjectionEnv env;
  env.fail_sync_dir = true;
  absl::Status status = WriteStateFileAtomic(dir.File("s.state"), "new", &env);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("dir fsync"), std::string::npos);
}

TEST(StateFileTest, CrashMidWriteNeverLoadsPartialTemp) {
  TempDir dir;
  const std::string path = dir.File("s.state");
  ASSERT_TRUE(WriteStateFileAtomic(path, "committed state").ok());
  const std::string next_payload(200, 'n');
  const size_t framed_size = kStateFileHeaderSize + next_payload.size();
  for (size_t cut : {size_t{0}, size_t{7}, size_t{31}, size_t{32}, size_t{100}, framed_size - 1,
                     framed_size}) {
    FaultInjectionEnv env;
    env.crash_after_bytes = static_cast<long>(cut);
    ASSERT_FALSE(WriteStateFileAtomic(path, next_payload, &env).ok());
    EXPECT_EQ(env.removes, 0);  // a dead process cleans nothing up
    // "Restart": the committed file is intact; the temp file is ignored, then removed.
    auto read = ReadStateFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, "committed state") << "cut " << cut;
    auto listed = ListStateFiles(dir.path(), ".state");
    ASSERT_TRUE(listed.ok());
    EXPECT_EQ(*listed, std::vector<std::string>{"s.state"});
    auto all = Env::Default()->ListDir(dir.path());
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->size(), 2u) << "cut " << cut;
    auto removed = RemoveLeftoverTempFiles(dir.path());
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 1);
  }
  // A crash before the very first commit leaves nothing loadable.
  FaultInjectionEnv env;
  env.crash_after_bytes = 40;
  ASSERT_FALSE(WriteStateFileAtomic(dir.File("new.state"), "abc", &env).ok());
  EXPECT_EQ(ReadStateFile(dir.File("new.state")).status().code(), absl::StatusCode::kNotFound);
  auto listed = ListStateFiles(dir.path(), ".state");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<std::string>{"s.state"});
}

TEST(StateFileTest, ListAndRemove) {
  TempDir dir;
  ASSERT_TRUE(Env::Default()->CreateDirs(dir.File("a/b")).ok());
  ASSERT_TRUE(Env::Default()->CreateDirs(dir.File("a/b")).ok());  // idempotent
  const std::string sub = dir.File("a/b");
  ASSERT_TRUE(WriteStateFileAtomic(sub + "/z.state", "z").ok());
  ASSERT_TRUE(WriteStateFileAtomic(sub + "/y.state", "y").ok());
  ASSERT_TRUE(WriteStateFileAtomic(sub + "/other.json", "o").ok());
  auto listed = ListStateFiles(sub, ".state");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<std::string>{"y.state", "z.state"}));
  ASSERT_TRUE(RemoveStateFile(sub + "/y.state").ok());
  ASSERT_TRUE(RemoveStateFile(sub + "/y.state").ok());  // already gone is fine
  listed = ListStateFiles(sub, ".state");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<std::string>{"z.state"});
  EXPECT_EQ(ListStateFiles(dir.File("missing"), ".state").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace caliper
