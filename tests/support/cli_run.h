// A fixture that runs the `caliper` binary the test was built with (CALIPER_BINARY) in a scratch
// directory of its own per test, capturing exit code, stdout and stderr.
#ifndef CALIPER_TESTS_SUPPORT_CLI_RUN_H_
#define CALIPER_TESTS_SUPPORT_CLI_RUN_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/fixtures.h"

namespace caliper::testing {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

class CliRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("caliper_") + info->test_suite_name() + "_" + std::to_string(::getpid()) +
            "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `args` is pasted into a shell command line after the binary: quote paths yourself.
  RunResult Run(const std::string& args) {
    const std::string out = Path("stdout.txt"), err = Path("stderr.txt");
    const std::string command =
        std::string("'") + CALIPER_BINARY + "' " + args + " >'" + out + "' 2>'" + err + "'";
    const int status = std::system(command.c_str());
    RunResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = ReadFileOrEmpty(out);
    result.err = ReadFileOrEmpty(err);
    return result;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_CLI_RUN_H_
