// QuantConfig validation, naming, parsing and the named presets.
#include "kvcompact/tq/config.hpp"

#include <charconv>
#include <string>

namespace kvcompact::tq {

Status QuantConfig::validate() const {
  if (key_mode != KeyMode::Mse && key_mode != KeyMode::Prod) {
    return make_error(ErrorCode::InvalidArgument, "key mode {} is neither mse nor prod", static_cast<int>(key_mode));
  }
  if (key_bits < 2 || key_bits > 5) {
    return make_error(ErrorCode::Unsupported, "key bits {} outside the supported 2..5 (mode {})", key_bits, name());
  }
  if (value_bits < 2 || value_bits > 4) {
    return make_error(ErrorCode::Unsupported, "value bits {} outside the supported 2..4 (mode {})", value_bits,
                      name());
  }
  if (norm_correction && key_mode == KeyMode::Prod) {
    return make_error(ErrorCode::Unsupported,
                      "norm correction is only defined for mse keys: it would bias the prod (QJL) estimator ({})",
                      name());
  }
  return ok_status();
}

std::string QuantConfig::name() const {
  std::string out = fmt::format("k={}{},v=mse{}", key_mode == KeyMode::Prod ? "prod" : "mse",
                                static_cast<unsigned>(key_bits), static_cast<unsigned>(value_bits));
  if (norm_correction) out += ",nc";
  if (exact_window > 0) out += fmt::format(",w={}", exact_window);
  return out;
}

QuantConfig QuantConfig::seed_system(std::uint64_t seed) {
  QuantConfig config;
  config.key_mode = KeyMode::Prod;
  config.key_bits = 3;
  config.value_bits = 2;
  config.norm_correction = false;
  config.seed = seed;
  return config;
}

QuantConfig QuantConfig::recommended(std::uint64_t seed) {
  // Chosen from `kvcompact eval` (docs/turboquant.md, "Choosing the default").
  QuantConfig config;
  config.key_mode = KeyMode::Mse;
  config.key_bits = 4;
  config.value_bits = 3;
  config.norm_correction = true;
  config.seed = seed;
  return config;
}

namespace {

Result<std::uint32_t> parse_uint(std::string_view text, std::string_view what) {
  std::uint32_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return make_error(ErrorCode::InvalidArgument, "'{}' is not a valid {}", text, what);
  }
  return value;
}

// "prod3" / "mse4" → (mode, bits)
Status parse_key_spec(std::string_view spec, QuantConfig& config) {
  std::string_view digits;
  if (spec.starts_with("prod")) {
    config.key_mode = KeyMode::Prod;
    digits = spec.substr(4);
  } else if (spec.starts_with("mse")) {
    config.key_mode = KeyMode::Mse;
    digits = spec.substr(3);
  } else {
    return make_error(ErrorCode::InvalidArgument, "key mode '{}' must be mse<bits> or prod<bits>", spec);
  }
  KVC_ASSIGN_OR_RETURN(std::uint32_t bits, parse_uint(digits, "key bit width"));
  if (bits > 255) return make_error(ErrorCode::Unsupported, "key bits {} outside 2..5", bits);
  config.key_bits = static_cast<std::uint8_t>(bits);
  return ok_status();
}

}  // namespace

Result<QuantConfig> QuantConfig::parse(std::string_view text, std::uint64_t seed) {
  if (text == "seed" || text == "seed-system") return seed_system(seed);
  if (text == "recommended" || text == "default") return recommended(seed);
  QuantConfig config = recommended(seed);
  config.norm_correction = false;
  bool saw_keys = false;
  bool saw_values = false;
  bool saw_nc = false;
  bool saw_window = false;
  // Each item at most once: a repeated one ("k=mse4,k=prod3") is an error, not "the last one wins".
  auto once = [&text](bool& seen, std::string_view item) -> Status {
    if (seen) {
      return make_error(ErrorCode::InvalidArgument, "mode '{}' gives its {} item twice", text, item);
    }
    seen = true;
    return ok_status();
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.starts_with("k=")) {
      KVC_TRY(once(saw_keys, "k="));
      KVC_TRY(parse_key_spec(item.substr(2), config));
    } else if (item.starts_with("v=")) {
      KVC_TRY(once(saw_values, "v="));
      std::string_view spec = item.substr(2);
      if (!spec.starts_with("mse")) {
        return make_error(ErrorCode::InvalidArgument, "value mode '{}' must be mse<bits>", spec);
      }
      KVC_ASSIGN_OR_RETURN(std::uint32_t bits, parse_uint(spec.substr(3), "value bit width"));
      if (bits > 255) return make_error(ErrorCode::Unsupported, "value bits {} outside 2..4", bits);
      config.value_bits = static_cast<std::uint8_t>(bits);
    } else if (item == "nc") {
      KVC_TRY(once(saw_nc, "nc"));
      config.norm_correction = true;
    } else if (item.starts_with("w=")) {
      KVC_TRY(once(saw_window, "w="));
      KVC_ASSIGN_OR_RETURN(config.exact_window, parse_uint(item.substr(2), "exact window"));
    } else {
      return make_error(ErrorCode::InvalidArgument,
                        "unknown mode item '{}' in '{}' (expected k=mse<b>|prod<b>, v=mse<b>, nc, w=<tokens>, "
                        "or a preset: seed, recommended)",
                        item, text);
    }
  }
  if (!saw_keys || !saw_values) {
    return make_error(ErrorCode::InvalidArgument, "mode '{}' must name both keys (k=...) and values (v=...)", text);
  }
  KVC_TRY(config.validate());
  return config;
}

}  // namespace kvcompact::tq
