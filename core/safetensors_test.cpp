// safetensors: round trip of every dtype, and one test per malformed-file
// class, each a clear SafetensorsError (never a crash).
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace dflash::safetensors {
namespace {

std::string raw(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string error_of(const std::string& bytes) {
  try {
    parse(bytes, "bad.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripEveryDtype) {
  const std::vector<at::ScalarType> types = {at::kDouble, at::kFloat, at::kHalf,  at::kBFloat16,
                                             at::kLong,   at::kInt,   at::kShort, at::kChar,
                                             at::kByte,   at::kBool};
  NamedTensors in;
  for (size_t i = 0; i < types.size(); ++i) {
    at::Tensor t = (at::randn({3, int64_t(i) + 1}, at::kDouble) * 50).to(types[i]);
    in.emplace_back(fmt::format("t{}.{}", i, at::toString(types[i])), t);
  }
  in.emplace_back("scalar", at::scalar_tensor(3.25, at::kDouble));
  in.emplace_back("empty", at::empty({0, 4}, at::kFloat));
  const File f = parse(serialize(in, {{"config", "{\"a\": 1}"}}), "mem");
  ASSERT_EQ(f.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, in[i].first);  // header order kept
    EXPECT_EQ(f.tensors[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_TRUE(at::equal(f.tensors[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(f.meta("config"), "{\"a\": 1}");
}

// No tensors and no metadata: the header is "{}" (it was "null", which the
// reader rightly refuses; found by fuzz_safetensors' round trip).
TEST(Safetensors, EmptyFileRoundTrips) {
  const std::string bytes = serialize({}, {});
  EXPECT_EQ(bytes.substr(8, 2), "{}");
  const File f = parse(bytes, "empty");
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

// A zero-size tensor whose leading dimensions alone would need more bytes
// than the file holds is still valid (it was refused when it came first).
TEST(Safetensors, ZeroSizeTensorWithLargeLeadingDimensionsIsRead) {
  const File f = parse(serialize({{"e", at::empty({1000, 7, 0}, at::kBFloat16)}}, {}), "zero");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].second.sizes(), (std::vector<int64_t>{1000, 7, 0}));
}

TEST(Safetensors, DataIsAlignedAndLittleEndian) {
  const std::string b = serialize({{"x", at::tensor({1.0f, 2.0f})}}, {});
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  float v;
  std::memcpy(&v, b.data() + 8 + n + 4, 4);
  EXPECT_EQ(v, 2.0f);
}

TEST(Safetensors, AtomicWriteLeavesNoTemporary) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("dflash_st_{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "x.safetensors").string();
  write(path, {{"x", at::ones({2})}}, {});
  write(path, {{"x", at::zeros({3})}}, {});  // replaces in place
  EXPECT_EQ(read(path).get("x").numel(), 3);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* expect;
};

class SafetensorsRejects : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsRejects, WithClearError) {
  const std::string msg = error_of(GetParam().bytes);
  ASSERT_FALSE(msg.empty()) << "accepted";
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find(GetParam().expect), std::string::npos) << msg;
}

std::string huge_length() {
  std::string b(16, ' ');
  const uint64_t n = uint64_t(1) << 40;
  std::memcpy(b.data(), &n, 8);
  return b;
}

const std::string kF32x2 = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsRejects,
    ::testing::Values(
        Malformed{"shorter_than_length", "\x05\x00\x00", "truncated"},
        Malformed{"header_past_end", raw(kF32x2, "").substr(0, 20), "truncated"},
        Malformed{"oversized_header", huge_length(), "exceeds"},
        Malformed{"malformed_json", raw("{\"x\": [1, 2", ""), "malformed JSON"},
        Malformed{"header_not_object", raw("[1, 2]", ""), "not a JSON object"},
        Malformed{"unknown_dtype",
                  raw(R"({"x":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "ab"),
                  "unknown dtype 'F8'"},
        Malformed{"data_truncated", raw(kF32x2, "1234"), "out of range"},
        Malformed{"offsets_reversed",
                  raw(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", "1234"),
                  "out of range"},
        Malformed{
            "offsets_overlap",
            raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                std::string(8, '\0')),
            "overlapping"},
        Malformed{
            "shape_size_mismatch",
            raw(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
            "need 12 bytes"},
        Malformed{
            "negative_shape",
            raw(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
            "shape entries"},
        Malformed{"missing_offsets",
                  raw(R"({"x":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
                  "data_offsets"},
        Malformed{"bad_metadata", raw(R"({"__metadata__":{"k":3}})", ""), "__metadata__.k"},
        Malformed{
            "shape_over_int64",
            raw(R"({"x":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", ""),
            "shape entries"},
        Malformed{"bool_not_0_or_1",
                  raw(R"({"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                      std::string("\x01\x07", 2)),
                  "not 0 or 1"}),
    [](const ::testing::TestParamInfo<Malformed>& i) { return std::string(i.param.name); });

TEST(Safetensors, MissingTensorIsNamed) {
  const File f = parse(serialize({{"a", at::ones({1})}}, {}), "x.safetensors");
  try {
    f.get("grad.fc.weight");
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("grad.fc.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, MissingFileIsNamed) {
  EXPECT_THROW(read("/nonexistent/x.safetensors"), SafetensorsError);
}

}  // namespace
}  // namespace dflash::safetensors
