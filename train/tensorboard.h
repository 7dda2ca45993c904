// TensorBoard event files for the run's scalars (train.report_to =
// "tensorboard", docs/TRAINING.md).
//
// RUN/events.out.tfevents.<time>.<host>.<pid>.dflash: a TFRecord stream of
// Event messages (tensorboard/compat/proto/event.proto, summary.proto):
// first Event{wall_time, file_version "brain.Event:2"}, then one
// Event{wall_time, step, summary{value{tag, simple_value}}} per scalar.
// `tensorboard --logdir runs/` lists each run directory as a run.
//
// Why not a maintained writer: the C++ ones sit on libprotobuf, and
// libtorch exports its own copy of protobuf's symbols (a second protobuf in
// the process is an ODR clash); the Python one (tensorboard's
// EventFileWriter) would make the C++ run depend on a Python package. So the
// five fields used are encoded here from the schema's field numbers, and the
// test reads the files back with the tensorboard package's own reader.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace dflash::train {

class TensorBoardWriter {
 public:
  // Opens a new event file in `dir` (a resumed run adds a file; TensorBoard
  // reads every file of a run directory in order).
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void flush() { out_.flush(); }
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

// Every number of a metrics.jsonl row as a scalar at the row's step, tagged
// "<kind>/<key>" ("train/loss", "served/acceptance"), list entries as
// "<kind>/<key>/<index>" ("eval/accuracy/1"). The always-zero slot 0 of the
// per-slot accuracy (the given anchor) is left out.
void write_metrics_row(TensorBoardWriter& w, const nlohmann::json& row);

// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it.
uint32_t crc32c(const std::string& data);
uint32_t masked_crc32c(const std::string& data);

}  // namespace dflash::train
