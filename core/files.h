// Whole files and JSON documents, read with errors that name the file: the
// one reader behind every parser of a file (configs, Hugging Face
// config.json, data sets, checkpoints' trainer_state.json, environment
// descriptions, prompt and text files). Each caller throws its own error
// type (ConfigError, DataError, CheckpointError, ...), so a bad file is
// reported the same way wherever it is read.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

namespace dflash {

// The file's bytes, or nothing when it cannot be opened.
std::optional<std::string> read_file_if_present(const std::string& path);

// The file's bytes; Error("PATH: cannot open WHAT") when it cannot be opened.
template <typename Error = std::runtime_error>
std::string read_whole_file(const std::string& path, const std::string& what = "") {
  std::optional<std::string> text = read_file_if_present(path);
  if (!text) throw Error(path + ": cannot open" + (what.empty() ? "" : " " + what));
  return std::move(*text);
}

// The text as JSON; Error("FILE: not valid JSON: ...") when it is not.
template <typename Error = std::runtime_error>
nlohmann::json parse_json(const std::string& text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": not valid JSON: " + e.what());
  }
}

}  // namespace dflash
