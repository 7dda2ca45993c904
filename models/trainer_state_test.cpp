// trainer_state.json is read back from disk on resume, possibly after another
// tool or a person edited it: every field is checked and a bad one is named
// (issue 14; fuzz/trainer_state_fuzz.cpp runs the same parser on mutations).
#include <gtest/gtest.h>

#include "models/checkpoint.h"

namespace dflash::models {
namespace {

std::string error_of(const std::string& text) {
  Checkpoint ck;
  try {
    parse_trainer_state(text, "s/trainer_state.json", ck);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerState, ReadsTheFieldsAndNamesEachBadOne) {
  Checkpoint ck;
  parse_trainer_state(R"({"step": 4, "cursor": 8, "optimizer_steps": 4, "threads": 2,
                          "config": {"train": {}}})",
                      "s/trainer_state.json", ck);
  EXPECT_EQ(ck.state.step, 4);
  EXPECT_EQ(ck.state.cursor, 8);
  EXPECT_EQ(ck.threads, 2);
  EXPECT_EQ(ck.config["__optimizer_steps"], 4);
  const char* ok = R"("cursor": 8, "optimizer_steps": 4, "config": {})";
  struct Case {
    std::string text;
    const char* expected;
  };
  for (const Case& c : {
           Case{"[1, 2]", "s/trainer_state.json: expected a JSON object, found array"},
           Case{"{\"step\": 4", "s/trainer_state.json: not valid JSON"},
           Case{std::string("{") + ok + "}", "s/trainer_state.json: step: missing"},
           Case{std::string("{\"step\": -1, ") + ok + "}",
                "s/trainer_state.json: step: expected an integer >= 0, found -1"},
           Case{std::string("{\"step\": 18446744073709551615, ") + ok + "}",
                "step: expected an integer >= 0, found 18446744073709551615"},
           Case{std::string("{\"step\": 1.5, ") + ok + "}", "step: expected an integer >= 0"},
           Case{std::string("{\"step\": 1, \"threads\": \"two\", ") + ok + "}",
                "threads: expected an integer in [0, 4096], found \"two\""},
           Case{std::string("{\"step\": 1, \"threads\": -3, ") + ok + "}",
                "threads: expected an integer in [0, 4096], found -3"},
           Case{std::string("{\"step\": 1, \"threads\": 5000, ") + ok + "}",
                "threads: expected an integer in [0, 4096], found 5000"},
           Case{R"({"step": 1, "cursor": 1, "optimizer_steps": 1, "config": []})",
                "config: expected an object, found array"},
       }) {
    const std::string msg = error_of(c.text);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.text << "\ngot: " << msg;
  }
}

}  // namespace
}  // namespace dflash::models
