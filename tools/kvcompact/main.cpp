// kvcompact CLI entry point: builds the CLI11 app from the registered sub-commands
// (plan, eval, inspect, ...) and maps errors to exit codes (0 ok, 1 error, 2 usage).
#include <algorithm>
#include <cstdio>

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
  }
  return exit_code;
}
