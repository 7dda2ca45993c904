#include "core/alloc_probe.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>

namespace dflash {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

void add(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t p = g_peak.load();
  while (now > p && !g_peak.compare_exchange_weak(p, now)) {
  }
}

struct Counted {
  c10::DataPtr inner;  // frees the memory when this context is deleted
  int64_t bytes;
  static void release(void* ctx) {
    auto* c = static_cast<Counted*>(ctx);
    g_live.fetch_sub(c->bytes);
    delete c;
  }
};

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

// PyTorch 2.3 dropped the const on allocate() and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif

 private:
  c10::DataPtr wrap(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    add(int64_t(n));
    return c10::DataPtr(data, new Counted{std::move(inner), int64_t(n)}, &Counted::release,
                        device);
  }
  c10::Allocator* base_;
};

}  // namespace

void AllocProbe::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    g_installed = true;
  });
}

bool AllocProbe::installed() { return g_installed; }
int64_t AllocProbe::live_bytes() { return g_live.load(); }

AllocProbe::Scope::Scope() : start_(g_live.load()), saved_peak_(g_peak.load()) {
  g_peak.store(start_);
}

AllocProbe::Scope::~Scope() {
  // The enclosing scope sees the max of its own and this scope's peak.
  int64_t inner = g_peak.load();
  g_peak.store(std::max(inner, saved_peak_));
}

int64_t AllocProbe::Scope::peak_bytes() const { return g_peak.load(); }

}  // namespace dflash
