// caliper: command-line client. `caliper <command> [flags]`; `caliper <command> --help`.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "client/commands.h"
#ifdef CALIPER_HAVE_GRPC_COMMANDS
#include "client/remote_commands.h"
#endif

namespace {

struct Command {
  const char* name;
  const char* summary;
  caliper::cli::CommandFn run;
};

// One row per subcommand; commands that need the server are added from their own library.
constexpr Command kCommands[] = {
    {"adapt", "adapt a LightLLM KV calibration file to another head count / TP (offline)",
     caliper::cli::RunAdaptCommand},
    {"merge", "add a scale file to an HF checkpoint as a new shard + quantization_config",
     caliper::cli::RunMergeCommand},
    {"quantize", "pack an HF checkpoint to NVFP4 with a scale file's global scales",
     caliper::cli::RunQuantizeCommand},
    {"convert", "render an existing calibration in other engines' formats (offline)",
     caliper::cli::RunConvertCommand},
#ifdef CALIPER_HAVE_GRPC_COMMANDS
    {"calibrate", "stream dumps to caliper-server, finalize, write LightLLM + scales.json",
     caliper::cli::RunCalibrateCommand},
    {"scales", "write a finalized session's scale files for another deployment",
     caliper::cli::RunScalesCommand},
    {"sessions", "list the server's sessions and their progress", caliper::cli::RunSessionsCommand},
#endif
};

void PrintUsage(std::ostream& out) {
  out << "usage: caliper <command> [flags]\n\ncommands:\n";
  for (const Command& command : kCommands) {
    out << "  " << command.name << std::string(12 - std::strlen(command.name), ' ')
        << command.summary << "\n";
  }
  out << "\nRun `caliper <command> --help` for a command's flags.\n";
}

}  // namespace

int main(int argc, char** argv) {
#ifdef CALIPER_HAVE_GRPC_COMMANDS
  caliper::cli::SetRemoteAdapt(caliper::cli::RunRemoteAdapt);
#endif
  if (argc < 2) {
    std::cerr << "caliper: missing command (see caliper --help)\n";
    return caliper::cli::kExitUsage;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(std::cout);
    return caliper::cli::kExitOk;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const Command& command : kCommands) {
    if (name == command.name) return command.run(args, std::cout, std::cerr);
  }
  std::cerr << "caliper: unknown command \"" << name << "\" (see caliper --help)\n";
  return caliper::cli::kExitUsage;
}
