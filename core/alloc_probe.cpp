#include "core/alloc_probe.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

namespace dflash {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void raise_peak(int64_t v) {
  int64_t p = g_peak.load();
  while (v > p && !g_peak.compare_exchange_weak(p, v)) {
  }
}

void add(int64_t n) { raise_peak(g_live.fetch_add(n) + n); }

// Sizes of the live allocations, by data pointer. The DataPtr keeps its
// context equal to the data pointer (c10's raw_allocate asserts that), so
// the size lives here instead of in the context.
std::mutex& sizes_mutex() {
  static auto* m = new std::mutex();  // never destroyed, like the map it guards
  return *m;
}
std::unordered_map<void*, int64_t>& sizes() {
  static auto* m =
      new std::unordered_map<void*, int64_t>();  // never destroyed: frees may come late
  return *m;
}
c10::DeleterFnPtr g_base_deleter = nullptr;

void counted_delete(void* p) {
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(sizes_mutex());
    auto it = sizes().find(p);
    if (it != sizes().end()) n = it->second, sizes().erase(it);
  }
  g_live.fetch_sub(n);
  g_base_deleter(p);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {
    g_base_deleter = base->raw_deleter();
    TORCH_CHECK(g_base_deleter, "AllocProbe: the CPU allocator has no raw deleter to wrap");
  }

// PyTorch 2.3 dropped the const on allocate() and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }

 private:
  c10::DataPtr wrap(size_t n) const {
    void* p = base_->raw_allocate(n);
    {
      std::lock_guard<std::mutex> lock(sizes_mutex());
      sizes()[p] = int64_t(n);
    }
    add(int64_t(n));
    return c10::DataPtr(p, p, &counted_delete, c10::Device(c10::DeviceType::CPU));
  }
  c10::Allocator* base_;
};

}  // namespace

void AllocProbe::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

int64_t AllocProbe::live_bytes() { return g_live.load(); }

namespace {

// A device's caching allocator (CUDA): allocated bytes, all pools.
c10::DeviceAllocator* device_allocator(const c10::Device& d) {
  return c10::getDeviceAllocator(d.type());
}
c10::DeviceIndex index_of(const c10::Device& d) { return d.has_index() ? d.index() : 0; }
constexpr size_t kAllPools = 0;  // StatType::AGGREGATE

// The allocator's peak can only be reset, not raised: what an enclosing
// scope had reached before a nested one reset it is carried here, per device.
std::mutex g_carry_mutex;
std::unordered_map<int, int64_t>& carried() {
  static auto* m = new std::unordered_map<int, int64_t>();
  return *m;
}

int64_t device_peak(const c10::Device& d) {
  const auto s = device_allocator(d)->getDeviceStats(index_of(d));
  std::lock_guard<std::mutex> lock(g_carry_mutex);
  return std::max<int64_t>(s.allocated_bytes[kAllPools].peak, carried()[index_of(d)]);
}

}  // namespace

int64_t AllocProbe::live_bytes(const c10::Device& d) {
  if (d.is_cpu()) return g_live.load();
  return device_allocator(d)->getDeviceStats(index_of(d)).allocated_bytes[kAllPools].current;
}

AllocProbe::Scope::Scope(c10::Device device)
    : device_(device), start_(live_bytes(device)), saved_peak_(0) {
  if (device_.is_cpu()) {
    saved_peak_ = g_peak.load();
    g_peak.store(start_);
    return;
  }
  saved_peak_ = device_peak(device_);
  device_allocator(device_)->resetPeakStats(index_of(device_));
  std::lock_guard<std::mutex> lock(g_carry_mutex);
  carried()[index_of(device_)] = 0;
}

AllocProbe::Scope::~Scope() {
  // The enclosing scope sees the max of its own and this scope's peak.
  if (device_.is_cpu()) {
    raise_peak(saved_peak_);
    return;
  }
  const int64_t inner = device_peak(device_);
  std::lock_guard<std::mutex> lock(g_carry_mutex);
  carried()[index_of(device_)] = std::max(saved_peak_, inner);
}

int64_t AllocProbe::Scope::peak_bytes() const {
  return device_.is_cpu() ? g_peak.load() : device_peak(device_);
}

}  // namespace dflash
