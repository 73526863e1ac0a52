#include "core/env/env.h"

#include <filesystem>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/fault_injection_env.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;
using testing_util::FaultInjectionEnv;
using testing_util::TempDir;

std::string Read(const std::string& path) { return Env::Default()->ReadFile(path).value(); }

bool HasTempFiles(const TempDir& dir) {
  for (const auto& item : std::filesystem::directory_iterator(dir.path())) {
    if (item.path().filename().string().find(std::string(kTempFileMarker)) != std::string::npos) return true;
  }
  return false;
}

TEST(EnvTest, AtomicWriteReplacesAndReportsAMissingDirectory) {
  TempDir dir;
  const std::string path = dir.File("x.json");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(Read(path), "second");
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::others_read);  // 0644 before the umask, not mkstemp's 0600
  const std::string nowhere = dir.File("no/such/x.json");
  absl::Status status = WriteFileAtomically(nowhere, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsIoError(status));
  EXPECT_THAT(status.message(), HasSubstr("no/such/x.json"));
  EXPECT_FALSE(HasTempFiles(dir));
}

TEST(EnvTest, EveryFailedStepKeepsTheOldFileAndRemovesTheTemporary) {
  for (int step = 0; step < 5; ++step) {
    TempDir dir;
    const std::string path = dir.File("out.json");
    ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
    FaultInjectionEnv env;
    env.fail_open = step == 0;
    env.fail_append = step == 1;
    env.fail_sync = step == 2;
    env.fail_close = step == 3;
    env.fail_rename = step == 4;
    absl::Status status = WriteFileAtomically(path, "new", &env);
    EXPECT_FALSE(status.ok()) << step;
    EXPECT_TRUE(IsIoError(status)) << step << " " << status;
    EXPECT_THAT(status.message(), HasSubstr("injected")) << step;
    EXPECT_EQ(Read(path), "old") << step;
    EXPECT_FALSE(HasTempFiles(dir)) << step;
  }
}

TEST(EnvTest, ADirectoryFsyncFailureIsReportedAfterTheRename) {
  TempDir dir;
  const std::string path = dir.File("out.json");
  FaultInjectionEnv env;
  env.fail_sync_dir = true;
  absl::Status status = WriteFileAtomically(path, "new", &env);
  EXPECT_TRUE(IsIoError(status));
  EXPECT_EQ(Read(path), "new");  // replaced, but not known to be durable
}

TEST(EnvTest, IoErrorsAreMarkedAndMappedFromErrno) {
  EXPECT_EQ(IoErrorFromErrno("open", "p", ENOENT).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(IoErrorFromErrno("write", "p", ENOSPC).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(IoErrorFromErrno("open", "p", EACCES).code(), absl::StatusCode::kPermissionDenied);
  absl::Status eio = IoErrorFromErrno("read", "dir/p", EIO);
  EXPECT_EQ(eio.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(eio.message(), "dir/p: cannot read (Input/output error)");
  EXPECT_TRUE(IsIoError(eio));
  EXPECT_FALSE(IsIoError(absl::InvalidArgumentError("bad input")));
  EXPECT_FALSE(IsIoError(absl::OkStatus()));
  EXPECT_FALSE(IsIoError(MarkIoError(absl::OkStatus())));
  // Context added on the way up keeps the mark and the code.
  absl::Status annotated = Annotate(eio, "--out ");
  EXPECT_TRUE(IsIoError(annotated));
  EXPECT_EQ(annotated.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(annotated.message(), "--out dir/p: cannot read (Input/output error)");
}

TEST(EnvTest, ReadListRemoveAndCreateDirs) {
  TempDir dir;
  Env* env = Env::Default();
  EXPECT_EQ(env->ReadFile(dir.File("absent")).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(env->CreateDirs(dir.File("a/b")).ok());
  ASSERT_TRUE(env->CreateDirs(dir.File("a/b")).ok());  // idempotent
  ASSERT_TRUE(WriteFileAtomically(dir.File("a/b/f"), "x").ok());
  auto names = env->ListDir(dir.File("a/b"));
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ::testing::ElementsAre("f"));
  ASSERT_TRUE(env->RemoveFile(dir.File("a/b/f")).ok());
  EXPECT_TRUE(IsIoError(env->RemoveFile(dir.File("a/b/f"))));
  EXPECT_EQ(DirName("a/b/f"), "a/b");
  EXPECT_EQ(DirName("f"), ".");
  EXPECT_EQ(DirName("/f"), "/");
}

TEST(EnvClockTest, TheDefaultClockIsTheWallClockAndWaitsForDoneOrTheDeadline) {
  Env* env = Env::Default();
  const absl::Time before = absl::Now();
  EXPECT_GE(env->Now(), before);
  EXPECT_LE(env->Now() - before, absl::Seconds(5));
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(env->WaitUntil(cv, lock, absl::InfiniteFuture(), [] { return true; }));
  EXPECT_FALSE(env->WaitUntil(cv, lock, env->Now() + absl::Milliseconds(5), [] { return false; }));
  bool done = false;
  std::thread notifier([&] {
    std::lock_guard<std::mutex> guard(mu);
    done = true;
    cv.notify_all();
  });
  EXPECT_TRUE(env->WaitUntil(cv, lock, absl::InfiniteFuture(), [&] { return done; }));
  lock.unlock();
  notifier.join();
}

TEST(EnvClockTest, AFakeClockEndsAWaitOnlyWhenAdvancedPastItsDeadline) {
  testing_util::FakeClockEnv clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  std::mutex mu;
  std::condition_variable cv;
  bool timed_out = false, returned = false;
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    timed_out = !clock.WaitUntil(cv, lock, clock.Now() + absl::Hours(24), [] { return false; });
    returned = true;
  });
  while (clock.waits() == 0) std::this_thread::yield();
  clock.Advance(absl::Hours(23));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(returned);  // a day has not passed on the clock
  }
  clock.Advance(absl::Hours(1));
  waiter.join();  // returns within a poll of the advance, not after a day
  EXPECT_TRUE(timed_out);
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100) + absl::Hours(24));
}

}  // namespace
}  // namespace caliper
