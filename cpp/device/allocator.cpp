// openreg's c10::DeviceAllocator (what torch.accelerator.memory_* read) and
// its pinned host allocator. Memory and statistics live in the Rust caching
// allocator (src/runtime/allocator.rs); this file converts and forwards.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatArray;

constexpr c10::DeviceType kOpenReg = c10::DeviceType::PrivateUse1;

// A DataPtr deleter must not throw: a bad free is reported as a warning.
void free_device_memory(void* ptr) {
  try {
    checked([&] { ffi::device_free(reinterpret_cast<uintptr_t>(ptr)); });
  } catch (const std::exception& e) {
    TORCH_WARN("openreg: freeing device memory failed: ", e.what());
  }
}

void free_pinned_memory(void* ptr) {
  ffi::host_free(reinterpret_cast<uintptr_t>(ptr));
}

Stat to_stat(const ffi::StatFfi& s) {
  Stat stat;
  stat.current = s.current;
  stat.peak = s.peak;
  stat.allocated = s.allocated;
  stat.freed = s.freed;
  return stat;
}

void to_stat_array(StatArray& out, const ffi::StatArrayFfi& in) {
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = to_stat(in.pools[i]);
  }
}

struct OpenRegDeviceAllocator final : public c10::DeviceAllocator {
  // Memory for the current stream of the current device. Out of memory is
  // a torch.OutOfMemoryError naming the device and its usage.
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = ffi::current_device();
    ffi::Allocation got = ffi::device_malloc(device, nbytes);
    if (!got.error.empty()) {
      TORCH_CHECK_WITH(OutOfMemoryError, !got.out_of_memory, std::string(got.error));
      TORCH_CHECK(false, std::string(got.error));
    }
    void* ptr = reinterpret_cast<void*>(got.ptr);
    return {ptr, ptr, &free_device_memory, c10::Device(kOpenReg, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device_memory;
  }

  // Storage-to-storage copies (e.g. Storage.clone) are synchronous: a
  // kernel on the current stream, which the caller waits for.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    run_in_stream_order(
        ffi::current_device(), "a storage copy (Storage.copy_/clone)", [&] { default_copy_data(dest, src, count); },
        "storage copy", [&] {
          KernelInfo info("storage copy");
          info.add_bytes(src, count, false);
          info.add_bytes(dest, count, true);
          return info;
        });
  }

  bool initialized() override {
    return ffi::any_device_initialized();
  }

  // Releases cached memory of every device (PyTorch passes no device).
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    ffi::empty_cache();
  }

  // Defers reuse of `ptr` after free until `stream`'s queued work is done.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    TORCH_CHECK(
        stream.device_type() == kOpenReg, "recordStream: expected an openreg stream, got ", stream);
    if (!ptr.get()) {
      return;
    }
    checked([&] {
      ffi::record_stream(reinterpret_cast<uintptr_t>(ptr.get()), stream.device_index(), stream.id());
    });
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    ffi::DeviceStatsFfi s = checked([&] { return ffi::device_stats(device); });
    DeviceStats stats;
    to_stat_array(stats.allocation, s.allocation);
    to_stat_array(stats.segment, s.segment);
    to_stat_array(stats.active, s.active);
    to_stat_array(stats.inactive_split, s.inactive_split);
    to_stat_array(stats.allocated_bytes, s.allocated_bytes);
    to_stat_array(stats.reserved_bytes, s.reserved_bytes);
    to_stat_array(stats.active_bytes, s.active_bytes);
    to_stat_array(stats.inactive_split_bytes, s.inactive_split_bytes);
    to_stat_array(stats.requested_bytes, s.requested_bytes);
    stats.num_alloc_retries = s.num_alloc_retries;
    stats.num_ooms = s.num_ooms;
    stats.num_sync_all_streams = s.num_sync_all_streams;
    stats.num_device_alloc = s.num_device_alloc;
    stats.num_device_free = s.num_device_free;
    stats.oversize_allocations = to_stat(s.oversize_allocations);
    stats.oversize_segments = to_stat(s.oversize_segments);
    stats.max_split_size = s.max_split_size;
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    checked([&] { ffi::reset_accumulated_stats(device); });
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    checked([&] { ffi::reset_peak_stats(device); });
  }

  // (free, total): capacity not reserved by the caching allocator, capacity.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    ffi::MemoryInfo info = checked([&] { return ffi::memory_info(device); });
    return {info.free, info.total};
  }
};

// Host memory registered with the runtime, so copies from and to it may be
// asynchronous and is_pinned() answers true.
struct PinnedHostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = reinterpret_cast<void*>(checked([&] { return ffi::host_malloc(nbytes); }));
    return {ptr, ptr, &free_pinned_memory, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned_memory;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

} // namespace

// Both allocators are created on first use and never destroyed: PyTorch
// keeps pointers to them until the process ends, and registration may run
// before this file's static initializers.
c10::Allocator* device_memory_allocator() {
  static auto* device_allocator = new OpenRegDeviceAllocator();
  return device_allocator;
}

void register_allocators() {
  c10::SetAllocator(kOpenReg, device_memory_allocator());
}

c10::Allocator* pinned_memory_allocator() {
  static auto* pinned_allocator = new PinnedHostAllocator();
  return pinned_allocator;
}

} // namespace openreg
