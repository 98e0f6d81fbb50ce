// Writes small valid inputs for each fuzz target into DIR/<target>/ (layer blobs, anchor images, model configs
// and mode strings), so the fuzzers start from real inputs (a checksum is hard to guess) and mutate past the
// header checks.
// Run by .ci/run.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_images.hpp"
#include "kvcompact/tq/snapshot_blob.hpp"

namespace {

void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// One small cache per mode; its layer-1 blobs (KVCB, and TQK1 / TQV1 for the seed preset).
int write_layer_blob_seeds(const std::filesystem::path& dir) {
  using namespace kvcompact::tq;
  std::filesystem::create_directories(dir);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  int index = 0;
  for (const char* mode : {"seed", "k=mse4,v=mse3,nc,w=4", "k=prod5,v=mse4"}) {
    for (std::uint32_t head_dim : {16u, 48u}) {
      auto config = QuantConfig::parse(mode, 7).value();
      CacheShape shape;
      shape.head_dim = head_dim;
      shape.kv_heads = {0, 1};
      shape.capacity = 8;
      auto cache = TurboQuantCache::create(shape, config);
      if (!cache.ok()) return 1;
      std::vector<float> rows(6 * head_dim);
      for (auto& x : rows) x = normal(rng);
      if (!cache->append(1, 0, 0, 6, kvcompact::DType::F32, rows.data(), rows.data()).ok()) return 1;
      auto blobs = snapshot_layer_blobs(*cache, 1, 0);
      if (!blobs.ok()) return 1;
      write_file(dir / ("kvcb_k_" + std::to_string(index)), blobs->keys);
      write_file(dir / ("kvcb_v_" + std::to_string(index)), blobs->values);
      if (std::string(mode) == "seed") {
        auto snapshot = cache->snapshot(1, 0).value();
        write_file(dir / ("tqk1_" + std::to_string(index)),
                   encode_seed_blob(snapshot_to_blob(snapshot, BlobKind::Keys).value()).value());
        write_file(dir / ("tqv1_" + std::to_string(index)),
                   encode_seed_blob(snapshot_to_blob(snapshot, BlobKind::Values).value()).value());
      }
      ++index;
    }
  }
  return 0;
}

// Anchor images of the fuzz model at a few positions (empty window, a partial window, a full window with
// compressed and indexer rows) and storages.
int write_anchor_image_seeds(const std::filesystem::path& dir) {
  using namespace kvcompact::dsv4;
  std::filesystem::create_directories(dir);
  int index = 0;
  for (StorageConfig storage : {StorageConfig{RowStorage::Fp8, IndexerStorage::Mxfp4},
                                StorageConfig{RowStorage::Bf16, IndexerStorage::Bf16},
                                StorageConfig{RowStorage::Fp8, IndexerStorage::Fp8}}) {
    for (std::uint32_t steps : {0u, 9u, 131u}) {
      const std::vector<std::uint8_t> image = kvcompact::fuzzing::fuzz_anchor_image(storage, steps);
      if (image.empty()) return 1;
      write_file(dir / ("anchor_" + std::to_string(index++)), image);
    }
  }
  return 0;
}

// The test suite's DeepSeek-V4 config files (valid and malformed) and a few TurboQuant mode strings.
int write_model_config_seeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::error_code ec;
  int copied = 0;
  for (const auto& entry : std::filesystem::directory_iterator(KVCOMPACT_GOLDEN_DSV4_DIR, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".config.json")) {
      std::filesystem::copy_file(entry.path(), dir / name, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return 1;
      ++copied;
    }
  }
  if (copied == 0) return 1;
  int index = 0;
  for (const char* mode : {"seed", "recommended", "k=mse4,v=mse3,nc,w=128", "k=prod5,v=mse4", "k=mse2,v=mse2,w=0"}) {
    const std::string text(mode);
    write_file(dir / ("mode_" + std::to_string(index++)), std::vector<std::uint8_t>(text.begin(), text.end()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  if (write_layer_blob_seeds(root / "kvcompact_layer_blob_fuzz") != 0) {
    std::fprintf(stderr, "make_seeds: could not build the layer blob seeds\n");
    return 1;
  }
  if (write_anchor_image_seeds(root / "kvcompact_anchor_image_fuzz") != 0) {
    std::fprintf(stderr, "make_seeds: could not build the anchor image seeds\n");
    return 1;
  }
  if (write_model_config_seeds(root / "kvcompact_model_config_fuzz") != 0) {
    std::fprintf(stderr, "make_seeds: could not copy the model config seeds from %s\n", KVCOMPACT_GOLDEN_DSV4_DIR);
    return 1;
  }
  return 0;
}
