// Sub-command registry for the kvcompact CLI: each command lives in its own cmd_<name>.cpp and
// registers itself with a static CommandRegistration, so adding a command touches no other file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kvcompact::cli {

// Adds the sub-command to `app`; the callback it installs runs the command and returns its exit code
// through `exit_code`.
using CommandSetup = std::function<void(CLI::App& app, int& exit_code)>;

struct CommandRegistration {
  CommandRegistration(std::string name, CommandSetup setup);
};

struct RegisteredCommand {
  std::string name;
  CommandSetup setup;
};
std::vector<RegisteredCommand>& registered_commands();

}  // namespace kvcompact::cli
