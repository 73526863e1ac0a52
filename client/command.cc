#include "client/command.h"

#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace caliper::cli {
namespace {

// Status payload that says which exit code an error asks for.
constexpr absl::string_view kExitPayload = "caliper.cli/exit";
constexpr absl::string_view kUsage = "usage";
constexpr absl::string_view kServer = "server";
constexpr absl::string_view kFindings = "findings";

bool HasMark(const absl::Status& status, absl::string_view mark) {
  const auto payload = status.GetPayload(kExitPayload);
  return payload.has_value() && *payload == mark;
}

absl::Status WithMark(absl::Status status, absl::string_view mark) {
  status.SetPayload(kExitPayload, absl::Cord(mark));
  return status;
}

// One line, whatever the message held, so scripts can grep it.
std::string OneLine(absl::string_view message) {
  return absl::StrReplaceAll(message, {{"\n", " "}});
}

}  // namespace

absl::Status UsageError(absl::string_view message) {
  return WithMark(absl::InvalidArgumentError(message), kUsage);
}

absl::Status ServerError(absl::string_view message) {
  return WithMark(absl::UnknownError(message), kServer);
}

absl::Status FindingsError(absl::string_view message) {
  return WithMark(absl::FailedPreconditionError(message), kFindings);
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (HasMark(status, kServer)) return kExitServer;
  if (HasMark(status, kFindings)) return kExitFindings;
  // A read or write of a local file that failed although its path is right (disk full, no
  // permission, a device error); a missing file or directory is a wrong path: input error.
  if (IsIoError(status) && !absl::IsNotFound(status)) return kExitIo;
  return kExitUsage;
}

std::string ExitCodeHelp(ServerUse server, bool reports_findings) {
  std::string text = "Exit codes: 0 done";
  if (server == ServerUse::kAlways) {
    absl::StrAppend(&text, ", 1 the server said no (its message is printed)");
  } else if (server == ServerUse::kWithServerFlag) {
    absl::StrAppend(&text, ", 1 with --server: the server said no (its message is printed)");
  }
  absl::StrAppend(&text, ", 2 usage or input error (one line on stderr, nothing written)");
  absl::StrAppend(&text, ", 3 I/O failure (a file could not be read or written: disk full, ...)");
  if (reports_findings) {
    absl::StrAppend(&text, ", 4 findings that break or degrade a selected engine");
  }
  return text + ".";
}

int RunCommand(const CommandSpec& command, const std::vector<std::string>& args,
               std::ostream& out, std::ostream& err) {
  const std::string prefix = absl::StrCat("caliper ", command.name, ": ");
  std::vector<std::string> words;
  size_t next = 0;
  for (const std::string& arg : args) {
    if (next < command.positionals.size() && words.size() == next && !arg.empty() &&
        arg[0] != '-') {
      words.push_back(absl::StrCat("--", command.positionals[next++], "=", arg));
    } else {
      words.push_back(arg);
    }
  }
  absl::StatusOr<CliArgs> flags = CliArgs::Parse(words, command.flags);
  if (flags.ok() && flags->help()) {
    out << FormatHelp(command.name, command.synopsis,
                      absl::StrCat(command.description, "\n",
                                   ExitCodeHelp(command.server, command.reports_findings)),
                      command.flags);
    return kExitOk;
  }
  if (flags.ok()) {
    for (const std::string& line : flags->deprecations()) {
      err << prefix << line << " (the old spelling goes away in the next release)\n";
    }
  }
  absl::Status status = flags.ok() ? command.run(*flags, out, err) : UsageError(flags.status().message());
  if (status.ok()) return kExitOk;
  err << prefix << OneLine(status.message());
  if (HasMark(status, kUsage)) err << " (see caliper " << command.name << " --help)";
  err << "\n";
  return ExitCodeFor(status);
}

int RunCaliper(const std::vector<const CommandSpec*>& commands,
               const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty()) {
    err << "caliper: missing command (see caliper --help)\n";
    return kExitUsage;
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    out << "usage: caliper <command> [flags]\n\ncommands:\n";
    for (const CommandSpec* command : commands) {
      out << "  " << command->name
          << std::string(command->name.size() < 12 ? 12 - command->name.size() : 1, ' ')
          << command->summary << "\n";
    }
    out << "\nRun `caliper <command> --help` for a command's flags.\n"
        << ExitCodeHelp(ServerUse::kAlways) << "\n";
    return kExitOk;
  }
  for (const CommandSpec* command : commands) {
    if (name == command->name) {
      return RunCommand(*command, std::vector<std::string>(args.begin() + 1, args.end()), out,
                        err);
    }
  }
  err << "caliper: unknown command \"" << name << "\" (see caliper --help)\n";
  return kExitUsage;
}

}  // namespace caliper::cli
