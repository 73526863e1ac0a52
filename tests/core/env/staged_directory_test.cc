// StagedDirectory: the output appears whole on Commit, nothing of it (and no staging) after a
// failure or without Commit; a non-empty target is refused and kept; an empty one is replaced.
// Also the Env calls it stands on: Stat, links, copies, RemoveTree.
#include "core/env/staged_directory.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fault_injection_env.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testing_util::FaultInjectionEnv;
using testing_util::TempDir;

std::string Read(const std::string& path) { return Env::Default()->ReadFile(path).value(); }
std::string StagingOf(const std::string& target) {
  return target + ".partial-" + std::to_string(::getpid());
}

TEST(StagedDirectoryTest, CommitMovesEveryFileIntoPlaceAtOnce) {
  TempDir dir;
  const std::string target = dir.File("out");
  auto staged = StagedDirectory::Create(target + "/");  // a trailing slash names the same dir
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ((*staged)->target(), target);
  ASSERT_TRUE((*staged)->WriteFile("a.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(dir.File("source.bin"), std::string(3 << 20, 'x')).ok());
  ASSERT_TRUE((*staged)->CopyFile(dir.File("source.bin"), "copy.bin").ok());
  auto file = (*staged)->NewFile("stream.bin");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("abc").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_FALSE(fs::exists(target));  // nothing visible before Commit
  ASSERT_TRUE((*staged)->Commit().ok());
  staged->reset();
  EXPECT_EQ(Read(target + "/a.json"), "{}");
  EXPECT_EQ(Read(target + "/copy.bin"), std::string(3 << 20, 'x'));
  EXPECT_EQ(Read(target + "/stream.bin"), "abc");
  EXPECT_FALSE(fs::exists(StagingOf(target)));
}

TEST(StagedDirectoryTest, WithoutCommitOrAfterAFailureNothingIsLeft) {
  TempDir dir;
  const std::string target = dir.File("out");
  {
    auto staged = StagedDirectory::Create(target);
    ASSERT_TRUE(staged.ok());
    ASSERT_TRUE((*staged)->WriteFile("a", "1").ok());
    ASSERT_TRUE(fs::create_directories((*staged)->PathOf("sub/deeper")));
    ASSERT_TRUE(Env::Default()->SymlinkFile(dir.path(), (*staged)->PathOf("link")).ok());
    EXPECT_TRUE(fs::exists(StagingOf(target)));
  }  // abandoned: removed, and the symlink's target (the temp dir itself) is not followed
  EXPECT_FALSE(fs::exists(StagingOf(target)));
  EXPECT_TRUE(fs::exists(dir.path()));
  for (int step = 0; step < 3; ++step) {
    FaultInjectionEnv env;
    env.fail_append = step == 0;
    env.fail_sync_dir = step == 1;
    env.fail_rename = step == 2;
    auto staged = StagedDirectory::Create(target, &env);
    ASSERT_TRUE(staged.ok());
    absl::Status status = (*staged)->WriteFile("a", "1");
    if (status.ok()) status = (*staged)->Commit();
    EXPECT_TRUE(IsIoError(status)) << step << " " << status;
    EXPECT_THAT(status.message(), HasSubstr("injected")) << step;
    staged->reset();
    EXPECT_FALSE(fs::exists(target)) << step;
    EXPECT_FALSE(fs::exists(StagingOf(target))) << step;
  }
}

TEST(StagedDirectoryTest, ANonEmptyTargetIsRefusedAndAnEmptyOneReplaced) {
  TempDir dir;
  const std::string target = dir.File("out");
  ASSERT_TRUE(WriteFileAtomically(dir.File("out-file"), "x").ok());
  EXPECT_EQ(StagedDirectory::Create(dir.File("out-file")).status().code(),
            absl::StatusCode::kFailedPrecondition);  // a file, not a directory
  ASSERT_TRUE(fs::create_directories(target));
  ASSERT_TRUE(WriteFileAtomically(target + "/keep", "mine").ok());
  auto refused = StagedDirectory::Create(target);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("exists and is not an empty directory"));
  EXPECT_EQ(Read(target + "/keep"), "mine");
  fs::remove(target + "/keep");
  auto staged = StagedDirectory::Create(target);
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE((*staged)->WriteFile("new", "2").ok());
  ASSERT_TRUE((*staged)->Commit().ok());
  EXPECT_EQ(Read(target + "/new"), "2");
}

TEST(EnvFilesTest, StatLinksCopiesAndRemoveTree) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(WriteFileAtomically(dir.File("f"), "12345").ok());
  absl::StatusOr<FileInfo> info = env->Stat(dir.File("f"));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->regular);
  EXPECT_FALSE(info->directory || info->symlink);
  EXPECT_EQ(info->size, 5u);
  EXPECT_TRUE(env->Stat(dir.path())->directory);
  absl::Status missing = env->Stat(dir.File("nope")).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsIoError(missing));

  ASSERT_TRUE(env->LinkFile(dir.File("f"), dir.File("hard")).ok());
  EXPECT_EQ(fs::hard_link_count(dir.File("f")), 2u);
  ASSERT_TRUE(env->SymlinkFile(dir.File("f"), dir.File("soft")).ok());
  info = env->Stat(dir.File("soft"));
  EXPECT_TRUE(info->symlink && info->regular);  // followed, and says it is a link
  EXPECT_EQ(env->LinkFile(dir.File("f"), dir.File("hard")).code(),
            absl::StatusCode::kInternal);  // EEXIST
  ASSERT_TRUE(env->CopyFile(dir.File("f"), dir.File("copy")).ok());
  EXPECT_EQ(Read(dir.File("copy")), "12345");
  EXPECT_EQ(fs::hard_link_count(dir.File("copy")), 1u);  // a file of its own (or a reflink)
  EXPECT_EQ(env->CopyFile(dir.File("nope"), dir.File("x")).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir.File("x")));
  // Never onto an existing file: through the hard link it would write into "f".
  absl::Status onto = env->CopyFile(dir.File("copy"), dir.File("hard"));
  EXPECT_FALSE(onto.ok());
  EXPECT_TRUE(IsIoError(onto));
  EXPECT_EQ(Read(dir.File("f")), "12345");

  ASSERT_TRUE(fs::create_directories(dir.File("tree/a/b")));
  ASSERT_TRUE(WriteFileAtomically(dir.File("tree/a/b/c"), "x").ok());
  ASSERT_TRUE(env->SymlinkFile(dir.File("f"), dir.File("tree/a/l")).ok());
  ASSERT_TRUE(RemoveTree(dir.File("tree")).ok());
  EXPECT_FALSE(fs::exists(dir.File("tree")));
  EXPECT_EQ(Read(dir.File("f")), "12345");  // a link's target is never removed
  EXPECT_TRUE(RemoveTree(dir.File("tree")).ok());  // already gone
  ASSERT_TRUE(env->RemoveFile(dir.File("soft")).ok());
  EXPECT_THAT(*env->ListDir(dir.path()), UnorderedElementsAre("f", "hard", "copy"));
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
}

}  // namespace
}  // namespace caliper
