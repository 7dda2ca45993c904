// A safetensors file (core/safetensors.cpp), header and data: a clean
// SafetensorsError, or tensors that serialize back to a file that parses to
// the same tensors.
#include <ATen/ATen.h>

#include <stdexcept>

#include "core/safetensors.h"
#include "fuzz/fuzz.h"

namespace st = dflash::safetensors;

DFLASH_FUZZ_TARGET({
  st::File f;
  try {
    f = st::parse(input, "fuzz.safetensors");
  } catch (const st::SafetensorsError&) {
    return 0;
  }
  const st::File back = st::parse(st::serialize(f.tensors, f.metadata), "reserialized");
  if (back.tensors.size() != f.tensors.size() || back.metadata != f.metadata)
    throw std::logic_error("safetensors round trip changed the file");
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const at::Tensor& a = f.tensors[i].second;
    const at::Tensor& b = back.tensors[i].second;
    // Bit patterns: NaN payloads must survive too.
    const bool same_bytes =
        a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
        (a.numel() == 0 || at::equal(a.view({-1}).view(at::kByte), b.view({-1}).view(at::kByte)));
    if (back.tensors[i].first != f.tensors[i].first || !same_bytes)
      throw std::logic_error("safetensors round trip changed " + f.tensors[i].first);
  }
})
