// kvcompact CLI entry point: builds the CLI11 app from the registered sub-commands
// (plan, eval, inspect, ...) and maps errors to exit codes (0 ok, 1 error, 2 usage). An exception out of a
// command (e.g. out of memory) is an error with its message, not an abort, and so is a failed write of the
// output (a full disk or a closed pipe must not look like success).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "command.hpp"

namespace kvcompact::cli {

std::vector<RegisteredCommand>& registered_commands() {
  static std::vector<RegisteredCommand> commands;
  return commands;
}

CommandRegistration::CommandRegistration(std::string name, CommandSetup setup) {
  registered_commands().push_back({std::move(name), std::move(setup)});
}

}  // namespace kvcompact::cli

int main(int argc, char** argv) {
  using namespace kvcompact::cli;
  CLI::App app{"kvcompact: compact KV caches (TurboQuant, DeepSeek-V4) — plan, evaluate, inspect"};
  app.require_subcommand(1);
  int exit_code = 0;
  auto& commands = registered_commands();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& command : commands) command.setup(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kvcompact: out of memory (the requested sizes need more than the host can allocate)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvcompact: %s\n", e.what());
    return 1;
  }
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "kvcompact: writing the output failed%s%s\n", errno != 0 ? ": " : "",
                 errno != 0 ? std::strerror(errno) : "");
    return 1;
  }
  return exit_code;
}
