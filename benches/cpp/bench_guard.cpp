// bench_guard: what openreg's device guard costs on PyTorch's hot paths,
// beside baselines measured in the same run.
//
//   build/cpp/bench_guard
//
// Reported (medians; see each section):
//   - a c10::DeviceGuard round trip openreg:0 -> openreg:1 -> openreg:0,
//     against a bare thread_local exchange round trip (the least any guard
//     must do; timed in batches alternating with the guard's) and PyTorch's
//     own no-op CPU guard; target: at most 3x bare;
//   - taking a stream from the pool (getStreamFromGlobalPool, getNewStream);
//   - event record+query and record+synchronize on an idle stream;
//     target: record+synchronize under 20 us.
// Not a test: it prints figures and exits 0 unless something throws.
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kOpenReg = c10::DeviceType::PrivateUse1;
constexpr int kBatches = 15;

// The baseline: what a guard round trip does at the least — swap a
// thread-local device index and put it back — in out-of-line calls, as a
// guard's are. noinline and the barrier keep the compiler from folding the
// loop away or hoisting the thread-local access out of it.
thread_local int8_t bare_current_device = 0;

__attribute__((noinline)) int8_t bare_exchange(int8_t device) {
  const int8_t previous = bare_current_device;
  bare_current_device = device;
  asm volatile("" ::: "memory");
  return previous;
}

__attribute__((noinline)) void bare_set(int8_t device) {
  bare_current_device = device;
  asm volatile("" ::: "memory");
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The time of one batch of `ops` calls of `op`, per call, in ns.
template <typename Op>
double batch_ns(long ops, Op& op) {
  const auto start = Clock::now();
  for (long i = 0; i < ops; ++i) {
    op();
  }
  const std::chrono::duration<double, std::nano> elapsed = Clock::now() - start;
  return elapsed.count() / double(ops);
}

// Median over kBatches batches of the per-operation time of `op`, in ns.
template <typename Op>
double ns_per_op(long ops_per_batch, Op op) {
  batch_ns(ops_per_batch / 10, op); // warm up
  std::vector<double> per_op;
  for (int batch = 0; batch < kBatches; ++batch) {
    per_op.push_back(batch_ns(ops_per_batch, op));
  }
  return median(per_op);
}

struct Paired {
  double a_ns;
  double b_ns;
  double ratio; // median of the per-pair ratios b / a
};

// Times `a` and `b` in alternating batches, so that both see the same
// machine (frequency, other load) and their ratio is steadier than the
// ratio of separately taken medians.
template <typename A, typename B>
Paired paired_ns_per_op(long ops_per_batch, A a, B b) {
  batch_ns(ops_per_batch / 10, a); // warm up
  batch_ns(ops_per_batch / 10, b);
  std::vector<double> as, bs, ratios;
  for (int batch = 0; batch < kBatches; ++batch) {
    as.push_back(batch_ns(ops_per_batch, a));
    bs.push_back(batch_ns(ops_per_batch, b));
    ratios.push_back(bs.back() / as.back());
  }
  return {median(as), median(bs), median(ratios)};
}

// Median of the medians of kBatches batches, each timing `iterations`
// single calls of `op`, in us. For operations of a microsecond or more,
// where timing each call is precise enough and shows the typical call.
template <typename Op>
double us_per_call(int iterations, Op op) {
  for (int i = 0; i < iterations / 10; ++i) {
    op(); // warm up
  }
  std::vector<double> batch_medians;
  std::vector<double> calls(iterations);
  for (int batch = 0; batch < kBatches; ++batch) {
    for (int i = 0; i < iterations; ++i) {
      const auto start = Clock::now();
      op();
      calls[i] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
    batch_medians.push_back(median(calls));
  }
  return median(batch_medians);
}

void row(const std::string& what, double value, const char* unit, const std::string& note = "") {
  std::printf("  %-52s %10.3f %-3s %s\n", what.c_str(), value, unit, note.c_str());
}

std::string verdict(bool met, const std::string& target) {
  return (met ? "meets target " : "MISSES target ") + target;
}

void run() {
  const c10::impl::DeviceGuardImplInterface& openreg = *c10::impl::getDeviceGuardImpl(kOpenReg);
  TORCH_CHECK(openreg.deviceCount() >= 2, "bench_guard needs two openreg devices (OPENREG_DEVICE_COUNT)");
  const c10::Device dev0(kOpenReg, 0);
  const c10::Device dev1(kOpenReg, 1);
  openreg.setDevice(dev0);

  std::printf("openreg guard benchmark (medians of %d batches)\n\n", kBatches);
  std::printf("  %-52s %10s %-3s %s\n", "operation", "time", "", "");

  constexpr long kGuardOps = 2'000'000;
  const Paired guard = paired_ns_per_op(
      kGuardOps, [] { bare_set(bare_exchange(1)); }, [&] { c10::DeviceGuard guard(dev1); });
  TORCH_CHECK(openreg.getDevice() == dev0, "the guard did not restore openreg:0");
  const c10::Device cpu(c10::DeviceType::CPU);
  row("bare thread_local exchange round trip", guard.a_ns, "ns", "(baseline)");
  row("c10::DeviceGuard(cpu) round trip (PyTorch, no-op)", ns_per_op(kGuardOps, [&] { c10::DeviceGuard g(cpu); }),
      "ns");
  row("c10::DeviceGuard openreg:0 -> openreg:1 -> openreg:0", guard.b_ns, "ns");
  row("  ratio to the bare round trip", guard.ratio, "x", verdict(guard.ratio <= 3.0, "<= 3x"));
  // A round trip makes two calls into the runtime; this is what one costs.
  row("  for scale: one call, openreg getDevice()", ns_per_op(kGuardOps, [&] { openreg.getDevice(); }), "ns");

  constexpr long kStreamOps = 1'000'000;
  row("getStreamFromGlobalPool(openreg:0)", ns_per_op(kStreamOps, [&] { openreg.getStreamFromGlobalPool(dev0); }),
      "ns");
  row("getNewStream(openreg:0, priority 0)", ns_per_op(kStreamOps, [&] { openreg.getNewStream(dev0, 0); }), "ns");

  // Events on an idle stream: nothing is queued, so this is the runtime's own
  // overhead. Each c10::Event is created once and re-recorded (versioned).
  constexpr int kEventCalls = 20'000;
  const c10::Stream stream = openreg.getStreamFromGlobalPool(dev0);
  stream.synchronize();
  for (const auto flag : {c10::EventFlag::PYTORCH_DEFAULT, c10::EventFlag::BACKEND_DEFAULT}) {
    const std::string kind = flag == c10::EventFlag::PYTORCH_DEFAULT ? "" : ", timing";
    c10::Event event(kOpenReg, flag);
    row("event record + query (idle stream" + kind + ")", us_per_call(kEventCalls, [&] {
          event.record(stream);
          TORCH_CHECK(event.query(), "an event on an idle stream is complete at once");
        }),
        "us");
    const double sync = us_per_call(kEventCalls, [&] {
      event.record(stream);
      event.synchronize();
    });
    row("event record + synchronize (idle stream" + kind + ")", sync, "us", verdict(sync < 20.0, "< 20 us"));
  }
}

} // namespace

int main() {
  try {
    run();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "bench_guard: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
