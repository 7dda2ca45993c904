// The one file reader (core/files.h): its bytes exactly, and each failure in
// the caller's error type, naming the file and what it was read as.
#include "core/files.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/config.h"
#include "fixtures/test_support.h"

namespace dflash {
namespace {

using testing_support::TmpDir;

TEST(Files, ReadsEveryByte) {
  TmpDir tmp;
  const std::string path = tmp / "bytes.bin", bytes("a\0b\r\n\xff", 6);
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(read_whole_file(path), bytes);
  EXPECT_EQ(read_file_if_present(path).value_or(""), bytes);
}

TEST(Files, MissingFileIsTheCallersErrorNamingFileAndWhat) {
  TmpDir tmp;
  const std::string path = tmp / "absent.toml";
  EXPECT_FALSE(read_file_if_present(path).has_value());
  try {
    read_whole_file<ConfigError>(path, "config file");
    FAIL() << "a missing file was read";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot open config file");
  }
  EXPECT_THROW(read_whole_file(path), std::runtime_error);
}

TEST(Files, InvalidJsonIsTheCallersErrorNamingTheFile) {
  EXPECT_EQ(parse_json(R"({"a": [1, 2]})", "x.json")["a"][1], 2);
  try {
    parse_json<ConfigError>("{\"a\": ", "config.json");
    FAIL() << "invalid JSON was parsed";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("config.json: not valid JSON: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace dflash
