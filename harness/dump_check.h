// `dflash step --from FILE --check`: every output and gradient a step dump
// records, compared with what dflash computes on the same inputs.
//
// Two modes:
//   bit for bit  -- dflash's own dumps (`dflash dump`, metadata producer
//                   kDflashProducer): the step recomputed by the same build
//                   must reproduce every recorded tensor exactly;
//   error ratio  -- a dump from another trainer (a PyTorch one): each recorded
//                   tensor is the candidate against dflash's float64 reference,
//                   held to the harness's rule for the dump's dtype
//                   (harness/parity.h dtype_rule, docs/HARNESS.md).
// Both fail on a NaN/inf, on a missing or an unknown tensor, on a gradient of
// a frozen weight and on a shape that differs; every message names the file
// and the tensor.
#pragma once

#include <string>

#include "harness/step_dump.h"
#include "harness/tolerance.h"

namespace dflash::harness {

enum class DumpMode { kAuto, kBitwise, kTolerance };
DumpMode parse_dump_mode(const std::string& s);  // "auto" | "bitwise" | "tolerance"

struct DumpCheck {
  std::string file;
  std::string mode;         // "bit for bit" or "error ratio (<dtype> rule: ...)"
  ComparisonReport report;  // one row per expected or recorded tensor
  bool ok() const { return report.ok(); }
  // The rows worst first (failures, then by error ratio), at most `rows`,
  // then one "FILE: tensor 'NAME': ..." line per failure.
  std::string format(size_t rows = 12) const;
};

// `recomputed`: the step run by dflash on the dump's inputs (used by the bit
// for bit mode). kAuto: bit for bit for dflash's own dumps, else error ratio.
DumpCheck check_step_dump(const StepDump& d, const StepResult& recomputed, DumpMode mode);

}  // namespace dflash::harness
