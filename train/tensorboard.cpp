// TensorBoard event files; see tensorboard.h.
#include "train/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace dflash::train {
namespace {

// Protocol-buffer wire format (varint, fixed64, fixed32, length-delimited).
void varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(char(v | 0x80));
    v >>= 7;
  }
  s.push_back(char(v));
}
template <typename T>
void fixed(std::string& s, T v) {  // little-endian, as the wire format and x86 store it
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
void key(std::string& s, int field, int wire) { varint(s, uint64_t(field << 3 | wire)); }
void bytes_field(std::string& s, int field, const std::string& v) {
  key(s, field, 2);
  varint(s, v.size());
  s += v;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event.wall_time = 1 (double), Event.step = 2 (int64).
std::string event_head(int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, now_s());
  key(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

}  // namespace

void write_metrics_row(TensorBoardWriter& w, const nlohmann::json& row) {
  const int64_t step = row.value("step", int64_t(0));
  const std::string kind = row.value("kind", std::string("train"));
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (it.key() == "step") continue;
    const std::string tag = kind + "/" + it.key();
    if (it.value().is_number()) {
      w.scalar(tag, it.value().get<double>(), step);
    } else if (it.value().is_array()) {
      const auto& a = it.value();
      for (size_t i = it.key() == "accuracy" ? 1 : 0; i < a.size(); ++i)
        if (a[i].is_number()) w.scalar(fmt::format("{}/{}", tag, i), a[i].get<double>(), step);
    }
  }
}

uint32_t crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const std::string& data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.dflash",
                                                    int64_t(now_s()), host, ::getpid()))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error(path_ + ": cannot create the TensorBoard event file");
  std::string e = event_head(0);
  bytes_field(e, 3, "brain.Event:2");  // Event.file_version = 3
  record(e);
  flush();
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;  // Summary.Value: tag = 1, simple_value = 2 (float)
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, float(value));
  std::string summary;  // Summary.value = 1
  bytes_field(summary, 1, v);
  std::string e = event_head(step);
  bytes_field(e, 5, summary);  // Event.summary = 5
  record(e);
}

// TFRecord: length (uint64), masked CRC of the length, data, masked CRC of the data.
void TensorBoardWriter::record(const std::string& event) {
  std::string len;
  fixed(len, uint64_t(event.size()));
  std::string rec = len;
  fixed(rec, masked_crc32c(len));
  rec += event;
  fixed(rec, masked_crc32c(event));
  out_.write(rec.data(), std::streamsize(rec.size()));
  if (!out_) throw std::runtime_error(path_ + ": writing the TensorBoard event file failed");
}

}  // namespace dflash::train
