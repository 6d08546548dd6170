// Shared by the fuzz targets: inputs that the parsers read from files are written to a private
// temporary folder (one per process) first.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ltm::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::filesystem::path p = std::filesystem::temp_directory_path() /
                              ("ltm-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// The real GPT-2 vocabulary (scripts/setup fetches it) or $LTM_GPT2_DIR.
inline std::string gpt2_dir() {
  if (const char* env = std::getenv("LTM_GPT2_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "/root") + "/.cache/ltm/gpt2";
}

}  // namespace ltm::fuzz
