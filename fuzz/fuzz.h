// Shared by the libFuzzer targets (fuzz/README in docs/RELIABILITY.md): the
// input as a string, and the rule every target enforces: a parser may only
// fail with its own documented error type (a clear message naming the file
// and field); any other exception, crash, leak or sanitizer report is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#define DFLASH_FUZZ_TARGET(body)                                            \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    const std::string input(reinterpret_cast<const char*>(data), size);     \
    body;                                                                   \
    return 0;                                                               \
  }
