// caliper: command-line client. `caliper <command> [flags]`; `caliper <command> --help`.
// The command table: one row per subcommand, each declared in its own file (client/command.h).
#include <iostream>
#include <string>
#include <vector>

#include "client/command.h"
#include "client/commands.h"
#ifdef CALIPER_HAVE_GRPC_COMMANDS
#include "client/remote_commands.h"
#endif

int main(int argc, char** argv) {
  namespace cli = caliper::cli;
  const std::vector<const cli::CommandSpec*> commands = {
      &cli::AdaptCommand(),
      &cli::MergeCommand(),
      &cli::ConvertCommand(),
      &cli::QuantizeCommand(),
      &cli::CheckCommand(),
#ifdef CALIPER_HAVE_GRPC_COMMANDS
      &cli::CalibrateCommand(),
      &cli::ScalesCommand(),
      &cli::SessionsCommand(),
      &cli::ReportCommand(),
      &cli::FleetsCommand(),
      &cli::VersionsCommand(),
#endif
  };
#ifdef CALIPER_HAVE_GRPC_COMMANDS
  cli::SetRemoteAdapt(cli::RemoteAdapt);
  cli::SetRemoteScaleFile(cli::RemoteScaleFile);
#endif
  return cli::RunCaliper(commands, std::vector<std::string>(argv + 1, argv + argc), std::cout,
                         std::cerr);
}
