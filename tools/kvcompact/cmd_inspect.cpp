// `kvcompact inspect FILE`: prints any kvcompact blob's or image's header and verifies it
// (KVCB layer blobs, the seed system's TQK1 / TQV1 blobs, DeepSeek-V4 anchor images).
// Exit code 0 when the file verifies, 1 when it does not or cannot be read.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "command.hpp"
#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/tq/blob.hpp"

namespace kvcompact::cli {
namespace {

struct InspectOptions {
  std::string path;
};

int run_inspect(const InspectOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(options.path, ec)) {
    std::fprintf(stderr, "kvcompact inspect: '%s' is a directory\n", options.path.c_str());
    return 1;
  }
  std::ifstream in(options.path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "kvcompact inspect: cannot open '%s'\n", options.path.c_str());
    return 1;
  }
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::printf("file              %s\n", options.path.c_str());
  bool ok = false;
  if (tq::is_layer_blob(bytes) || tq::is_seed_blob(bytes)) {
    std::fputs(tq::describe_blob(bytes).c_str(), stdout);
    ok = tq::is_layer_blob(bytes) ? tq::decode_layer_blob(bytes).ok() : tq::decode_seed_blob(bytes, 0, 0).ok();
  } else if (dsv4::looks_like_anchor_image(bytes)) {
    auto text = dsv4::describe_anchor_image(bytes);
    if (text.ok()) {
      std::fputs(text->c_str(), stdout);
    } else {
      std::printf("verification      FAILED: %s\n", text.error().to_string().c_str());
    }
    ok = dsv4::decode_anchor_image(bytes).ok();
  } else {
    std::printf("format            unknown: %zu bytes without a KVCB, TQK1, TQV1 or anchor-image magic\n",
                bytes.size());
  }
  return ok ? 0 : 1;
}

const CommandRegistration registration{"inspect", [](CLI::App& app, int& exit_code) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a blob's or image's header and verify it");
  cmd->add_option("file", options->path, "KVCB / TQK1 / TQV1 blob or DeepSeek-V4 anchor image")->required();
  cmd->callback([options, &exit_code] { exit_code = run_inspect(*options); });
}};

}  // namespace
}  // namespace kvcompact::cli
