// Counterexample files are input (`dflash parity --reproduce FILE`): their
// sizes, anchors and masks are checked before anything is allocated or
// indexed by them (issue 14). The fuzz target fuzz/counterexample_fuzz.cpp
// runs the same function on mutated files.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "harness/properties.h"

namespace dflash::harness {
namespace {

std::string seed(const std::string& name) {
  const char* root = std::getenv("DFLASH_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") + "/fuzz/corpus/counterexample/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t p = text.find(from);
  if (p == std::string::npos) throw std::logic_error("no " + from);
  return text.replace(p, from.size(), to);
}

std::string error_of(const std::string& text) {
  try {
    validate_component_case(text, "case.toml");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(ReplayInput, WrittenCasesAreAccepted) {
  EXPECT_EQ(validate_component_case(seed("attention-anchors.toml"), "a.toml"), "attention");
  EXPECT_EQ(validate_component_case(seed("loss.toml"), "l.toml"), "loss");
  EXPECT_EQ(validate_component_case(seed("checkpoint.toml"), "c.toml"), "checkpoint");
}

TEST(ReplayInput, SizesAnchorsAndMasksAreChecked) {
  const std::string att = seed("attention-anchors.toml");
  struct Case {
    std::string text;
    const char* expected;
  };
  for (const Case& c : {
           // An anchor past the context would index past the keys.
           Case{with(att, "[[0, 5], [2, 3]]", "[[0, 6], [2, 3]]"),
                "case.toml: case.anchors[0][1]: expected an integer in [0, 5]"},
           Case{with(att, "[[0, 5], [2, 3]]", "[[-1, 5], [2, 3]]"), "case.anchors[0][0]"},
           Case{with(att, "[[1, 0], [1, 1]]", "[[1, 2], [1, 1]]"),
                "case.keep[0][1]: expected an integer in [0, 1]"},
           Case{with(att, "B = 2", "B = 1000000000"),
                "case.B: expected an integer in [1, 256], found 1000000000"},
           Case{with(with(att, "S = 7", "S = 4096"), "head_dim = 8", "head_dim = 512"),
                "a replayed case holds at most 2^24"},
           // A float where an integer belongs: refused, never cast (1e41 overflows
           // int64; fuzz/corpus/counterexample/regression-float-size.toml).
           Case{with(att, "B = 2", "B = 1e41"), "case.B is missing or not an integer"},
           Case{with(att, "B = 2", "B = 2.0"), "case.B is missing or not an integer"},
           Case{with(att, "component = \"attention\"", "component = \"lm_head\""),
                "is not loss, attention or checkpoint"},
           Case{with(seed("checkpoint.toml"), "width = 1", "width = 5000"),
                "case.width: expected an integer in [1, 4096]"},
       }) {
    const std::string msg = error_of(c.text);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << "got: " << msg;
  }
}

}  // namespace
}  // namespace dflash::harness
