// Contract tests, from C++, of openreg's c10::impl::DeviceGuardImplInterface
// and at::PrivateUse1HooksInterface, reached the way PyTorch reaches them
// (c10::impl::getDeviceGuardImpl, c10::DeviceGuard, c10::Event,
// at::detail::getPrivateUse1Hooks).
//
//   test_guard <group>    groups: hooks device streams events threads errors
//                         (for OPENREG_DEVICE_COUNT=2), no_devices (for 0 or
//                         an invalid count), or "all" (those for the count in
//                         force); exit status 0 iff every check passed.
//
// Each ctest entry runs one group in a fresh process: the hooks group checks
// that no device context exists before first use, which only holds there.
//
// The tests would fail if a method were stubbed: asynchronous work is real.
// Host functions queued with openreg.h's orLaunchHostFunc on the stream's
// native handle (an orStream_t) keep a stream busy until a Gate opens, so
// "not done yet" and "waited for it" are both observed, not assumed.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <openreg.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// ---- a tiny check harness (thread-safe) ------------------------------------

std::atomic<int> passed{0};
std::atomic<int> failed{0};
std::mutex print_mutex;

void fail(const std::string& what, const char* file, int line) {
  failed.fetch_add(1);
  std::lock_guard<std::mutex> lock(print_mutex);
  std::printf("  FAIL %s:%d: %s\n", file, line, what.c_str());
}

void check(bool ok, const char* what, const char* file, int line) {
  if (ok) {
    passed.fetch_add(1);
  } else {
    fail(what, file, line);
  }
}

// Printable form; int8_t device indices would print as characters.
template <typename T>
std::string show(const T& value) {
  std::ostringstream out;
  if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
    out << int(value);
  } else {
    out << value;
  }
  return out.str();
}

template <typename A, typename B>
void check_eq(const A& a, const B& b, const char* what, const char* file, int line) {
  if (a == b) {
    passed.fetch_add(1);
  } else {
    fail(std::string(what) + "  (" + show(a) + " vs " + show(b) + ")", file, line);
  }
}

// Passes if `call` throws a c10::Error whose what() contains every needle.
template <typename F>
void check_throws(F&& call, std::initializer_list<const char*> needles, const char* what, const char* file,
                  int line) {
  try {
    call();
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    for (const char* needle : needles) {
      if (message.find(needle) == std::string::npos) {
        fail(std::string(what) + ": message lacks \"" + needle + "\": " + e.what_without_backtrace(), file, line);
        return;
      }
    }
    passed.fetch_add(1);
    return;
  } catch (const std::exception& e) {
    fail(std::string(what) + ": threw a non-c10 exception: " + e.what(), file, line);
    return;
  }
  fail(std::string(what) + ": did not throw", file, line);
}

#define CHECK(...) check(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)
#define CHECK_EQ(a, b) check_eq((a), (b), #a " == " #b, __FILE__, __LINE__)
#define CHECK_THROWS(expr, ...) \
  check_throws([&] { (void)(expr); }, {__VA_ARGS__}, #expr, __FILE__, __LINE__)

// ---- openreg as PyTorch sees it --------------------------------------------

constexpr auto kOpenReg = c10::DeviceType::PrivateUse1;
const c10::Device kDev0(kOpenReg, 0);
const c10::Device kDev1(kOpenReg, 1);
const c10::Device kCpu(c10::DeviceType::CPU);

const c10::impl::DeviceGuardImplInterface& impl() {
  return *c10::impl::getDeviceGuardImpl(kOpenReg);
}

const at::PrivateUse1HooksInterface& hooks() {
  return at::detail::getPrivateUse1Hooks();
}

// The runtime's stream behind a c10::Stream: getStreamNativeHandle's
// documented meaning.
orStream_t native(const c10::Stream& stream) {
  return static_cast<orStream_t>(impl().getStreamNativeHandle(stream));
}

// Queues `fn` on `stream` as a host function: real work in stream order.
void launch(const c10::Stream& stream, std::function<void()> fn) {
  auto* boxed = new std::function<void()>(std::move(fn));
  const int status = orLaunchHostFunc(
      native(stream),
      [](void* data) {
        std::unique_ptr<std::function<void()>> work(static_cast<std::function<void()>*>(data));
        (*work)();
      },
      boxed);
  if (status != orSuccess) {
    delete boxed;
    throw std::runtime_error(std::string("orLaunchHostFunc failed: ") + orGetLastErrorMessage());
  }
}

// A latch the test opens. A host function waiting on it keeps its stream busy
// exactly as long as the test wants. It opens itself when the test's scope
// ends, and after 10 s regardless, so a failing test cannot hang the process.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() {
    open();
  }

  void open() const {
    state_->open();
  }

  // Opens the gate from another thread after `delay`.
  std::thread open_after(std::chrono::milliseconds delay) const {
    return std::thread([state = state_, delay] {
      std::this_thread::sleep_for(delay);
      state->open();
    });
  }

  // A host function body that waits for the gate, then runs `then`.
  std::function<void()> wait_then(std::function<void()> then = [] {}) const {
    return [state = state_, then = std::move(then)] {
      state->wait();
      then();
    };
  }

 private:
  // Shared with the host functions, which may outlive the Gate.
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    bool is_open = false;

    void open() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        is_open = true;
      }
      cv.notify_all();
    }

    void wait() {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait_for(lock, 10s, [&] { return is_open; });
    }
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

using Flag = std::shared_ptr<std::atomic<bool>>;

Flag make_flag() {
  return std::make_shared<std::atomic<bool>>(false);
}

// Polls `condition` for up to `limit`; true as soon as it holds.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 2000ms) {
  const auto deadline = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// True if `condition` stays false for the whole of `window`.
bool stays_false(const std::function<bool()>& condition, std::chrono::milliseconds window = 50ms) {
  return !eventually(condition, window);
}

c10::Stream stream_with_id(c10::Device device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, device, id);
}

// ---- group: device ---------------------------------------------------------

void test_type_and_count() {
  CHECK_EQ(impl().type(), kOpenReg);
  CHECK_EQ(c10::get_privateuse1_backend(), std::string("openreg"));
  const c10::Device parsed("openreg:1");
  CHECK_EQ(parsed, kDev1);
  CHECK_EQ(parsed.str(), std::string("openreg:1"));

  int count = -1;
  CHECK_EQ(orGetDeviceCount(&count), orSuccess);
  CHECK_EQ(count, 2); // ctest sets OPENREG_DEVICE_COUNT=2
  CHECK_EQ(int(impl().deviceCount()), count);
}

void test_get_set_exchange_device() {
  CHECK_EQ(impl().getDevice(), kDev0); // every thread starts on device 0
  impl().setDevice(kDev1);
  CHECK_EQ(impl().getDevice(), kDev1);
  int current = -1;
  CHECK_EQ(orGetDevice(&current), orSuccess); // one current device, not two
  CHECK_EQ(current, 1);

  CHECK_EQ(impl().exchangeDevice(kDev0), kDev1);
  CHECK_EQ(impl().getDevice(), kDev0);
  CHECK_EQ(impl().exchangeDevice(kDev0), kDev0); // same device: a no-op exchange
  CHECK_EQ(impl().getDevice(), kDev0);
}

void test_unchecked_set_device() {
  impl().uncheckedSetDevice(kDev1);
  CHECK_EQ(impl().getDevice(), kDev1);
  // An invalid index must not throw (destructors call this); it is ignored.
  impl().uncheckedSetDevice(c10::Device(kOpenReg, 9));
  CHECK_EQ(impl().getDevice(), kDev1);
  impl().uncheckedSetDevice(kDev0);
  CHECK_EQ(impl().getDevice(), kDev0);
}

void test_device_guard() {
  {
    c10::DeviceGuard outer(kDev1);
    CHECK_EQ(impl().getDevice(), kDev1);
    CHECK_EQ(outer.original_device(), kDev0);
    {
      c10::DeviceGuard inner(kDev0);
      CHECK_EQ(impl().getDevice(), kDev0);
      inner.reset_device(kDev1);
      CHECK_EQ(impl().getDevice(), kDev1);
    }
    CHECK_EQ(impl().getDevice(), kDev1);
  }
  CHECK_EQ(impl().getDevice(), kDev0);
  {
    c10::OptionalDeviceGuard optional;
    CHECK_EQ(impl().getDevice(), kDev0);
    optional.reset_device(kDev1);
    CHECK_EQ(impl().getDevice(), kDev1);
  }
  CHECK_EQ(impl().getDevice(), kDev0);
}

void test_device_capability() {
  for (const c10::Device& device : {kDev0, kDev1, c10::Device(kOpenReg)}) {
    const auto types = impl().getDeviceCapability(device).capability_data.supported_scalar_types;
    CHECK(types.has_Float && types.has_Half && types.has_BFloat16 && types.has_Long && types.has_Bool);
    // No quantized kernels exist here, and the capability says so; nor can
    // bit-packed or sub-byte dtypes be converted (tests/python/test_dtypes.py).
    CHECK(!types.has_QInt8 && !types.has_QUInt8 && !types.has_QInt32);
    CHECK(!types.has_Bits8 && !types.has_Int4 && !types.has_UInt4 && !types.has_Float4_e2m1fn_x2);
  }
}

// ---- group: streams --------------------------------------------------------

void test_current_and_default_streams() {
  const c10::Stream default0 = impl().getDefaultStream(kDev0);
  CHECK_EQ(default0.id(), c10::StreamId(0));
  CHECK_EQ(default0.device(), kDev0);
  CHECK_EQ(impl().getStream(kDev0), default0); // a thread starts on the default stream
  CHECK_EQ(impl().getDefaultStream(kDev1), stream_with_id(kDev1, 0));
  // An index-less device means the current device, and the stream says which.
  c10::DeviceGuard guard(kDev1);
  CHECK_EQ(impl().getStream(c10::Device(kOpenReg)).device(), kDev1);
  CHECK_EQ(impl().getDefaultStream(c10::Device(kOpenReg)).device(), kDev1);
}

void test_pool_streams_and_priorities() {
  int least = 99;
  int greatest = 99;
  CHECK_EQ(orDeviceGetStreamPriorityRange(&least, &greatest), orSuccess);
  CHECK_EQ(least, 0);
  CHECK_EQ(greatest, -1);

  auto priority_of = [](const c10::Stream& stream) {
    int priority = 99;
    CHECK_EQ(orStreamGetPriority(native(stream), &priority), orSuccess);
    return priority;
  };
  const c10::Stream normal = impl().getStreamFromGlobalPool(kDev1, /*isHighPriority=*/false);
  const c10::Stream high = impl().getStreamFromGlobalPool(kDev1, /*isHighPriority=*/true);
  CHECK_EQ(normal.device(), kDev1);
  CHECK(normal.id() >= 1 && normal.id() <= 32);
  CHECK(high.id() >= 33 && high.id() <= 64);
  CHECK_EQ(priority_of(normal), 0);
  CHECK_EQ(priority_of(high), -1);

  // Out-of-range priorities are clamped into [greatest, least].
  const c10::Stream very_high = impl().getNewStream(kDev1, -100);
  const c10::Stream very_low = impl().getNewStream(kDev1, 100);
  CHECK(very_high.id() >= 33 && very_high.id() <= 64);
  CHECK(very_low.id() >= 1 && very_low.id() <= 32);
  CHECK_EQ(priority_of(very_high), -1);
  CHECK_EQ(priority_of(very_low), 0);
}

// getNewStream hands out a priority's 32 pool streams round-robin.
void test_get_new_stream_round_robin() {
  for (int priority : {0, -1}) {
    std::vector<c10::StreamId> ids;
    for (int i = 0; i < 33; ++i) {
      ids.push_back(impl().getNewStream(kDev0, priority).id());
    }
    const c10::StreamId first_id = priority == 0 ? 1 : 33;
    const std::set<c10::StreamId> distinct(ids.begin(), ids.begin() + 32);
    CHECK_EQ(distinct.size(), size_t(32));
    CHECK_EQ(*distinct.begin(), first_id);
    CHECK_EQ(*distinct.rbegin(), first_id + 31);
    bool in_turn = true;
    for (size_t i = 1; i < ids.size(); ++i) {
      in_turn = in_turn && ids[i] == first_id + (ids[i - 1] - first_id + 1) % 32;
    }
    CHECK(in_turn);
    CHECK_EQ(ids[32], ids[0]); // the 33rd request wraps around
  }
}

void test_exchange_stream() {
  const c10::Stream pooled = impl().getStreamFromGlobalPool(kDev1);
  CHECK_EQ(impl().getDevice(), kDev0);
  const c10::Stream previous = impl().exchangeStream(pooled);
  CHECK_EQ(previous, impl().getDefaultStream(kDev1));
  CHECK_EQ(impl().getStream(kDev1), pooled);
  CHECK_EQ(impl().getDevice(), kDev0); // the current device does not change
  CHECK_EQ(impl().getStream(kDev0), impl().getDefaultStream(kDev0));
  CHECK_EQ(impl().exchangeStream(previous), pooled);
  CHECK_EQ(impl().getStream(kDev1), previous);

  // StreamGuard: device and stream, both restored.
  {
    c10::StreamGuard guard(pooled);
    CHECK_EQ(impl().getDevice(), kDev1);
    CHECK_EQ(impl().getStream(kDev1), pooled);
  }
  CHECK_EQ(impl().getDevice(), kDev0);
  CHECK_EQ(impl().getStream(kDev1), previous);
}

void test_native_handles() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev0);
  const c10::Stream b = impl().getStreamFromGlobalPool(kDev0);
  CHECK(a != b);
  CHECK(native(a) != nullptr);
  CHECK_EQ(native(a), native(a));
  CHECK_EQ(native(a), native(stream_with_id(kDev0, a.id()))); // a stream is its (device, id)
  CHECK_EQ(a.native_handle(), static_cast<void*>(native(a)));
  CHECK(native(a) != native(b));
  CHECK(native(stream_with_id(kDev0, 0)) != native(stream_with_id(kDev1, 0)));

  // The handle is the runtime's orStream_t for exactly that stream.
  int device = -1;
  int64_t id = -1;
  CHECK_EQ(orStreamGetId(native(a), &device, &id), orSuccess);
  CHECK_EQ(device, 0);
  CHECK_EQ(id, a.id());
}

void test_query_and_synchronize_stream() {
  const c10::Stream stream = impl().getStreamFromGlobalPool(kDev0);
  CHECK(impl().queryStream(stream)); // nothing submitted yet

  Gate gate;
  Flag done = make_flag();
  launch(stream, gate.wait_then([done] { *done = true; }));
  CHECK(!impl().queryStream(stream));
  CHECK(stays_false([&] { return impl().queryStream(stream); }));

  std::thread opener = gate.open_after(50ms);
  const auto start = Clock::now();
  impl().synchronizeStream(stream);
  const auto waited = Clock::now() - start;
  opener.join();
  CHECK(done->load()); // synchronize returned only after the work ran
  CHECK(waited >= 40ms);
  CHECK(impl().queryStream(stream));

  // Work runs in submission order.
  auto order = std::make_shared<std::vector<int>>();
  for (int i = 0; i < 3; ++i) {
    launch(stream, [order, i] {
      std::this_thread::sleep_for(2ms);
      order->push_back(i);
    });
  }
  stream.synchronize();
  CHECK(*order == std::vector<int>({0, 1, 2}));
}

void test_is_stream_capturing() {
  CHECK(!impl().isStreamCapturing(impl().getDefaultStream(kDev0)));
  CHECK(!impl().isStreamCapturing(impl().getStreamFromGlobalPool(kDev1)));
}

// synchronizeDevice waits for every stream of that device, and only that one.
void test_synchronize_device() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev1);
  const c10::Stream b = impl().getStreamFromGlobalPool(kDev1, /*isHighPriority=*/true);
  const c10::Stream other = impl().getStreamFromGlobalPool(kDev0);
  Gate gate1;
  Gate gate0;
  Flag a_done = make_flag();
  Flag b_done = make_flag();
  launch(a, gate1.wait_then([a_done] { *a_done = true; }));
  launch(b, gate1.wait_then([b_done] { *b_done = true; }));
  launch(other, gate0.wait_then());

  std::thread opener = gate1.open_after(50ms);
  impl().synchronizeDevice(1);
  opener.join();
  CHECK(a_done->load() && b_done->load());
  CHECK(!impl().queryStream(other)); // device 0's work was not waited for
  gate0.open();
  impl().synchronizeDevice(0);
  CHECK(impl().queryStream(other));
}

// ---- group: events ---------------------------------------------------------

// Records through the guard, as c10::Event does.
void record(void** event, const c10::Stream& stream, c10::EventFlag flag = c10::EventFlag::PYTORCH_DEFAULT) {
  impl().record(event, stream, /*device_index=*/-1, flag);
}

void test_record_query_synchronize_event() {
  const c10::Stream stream = impl().getStreamFromGlobalPool(kDev0);
  void* event = nullptr;
  CHECK(impl().queryEvent(event)); // never recorded: complete
  impl().synchronizeEvent(event);  // and nothing to wait for

  Gate gate;
  Flag done = make_flag();
  launch(stream, gate.wait_then([done] { *done = true; }));
  record(&event, stream);
  CHECK(event != nullptr); // the first record creates the event
  CHECK(!impl().queryEvent(event));
  CHECK(stays_false([&] { return impl().queryEvent(event); }));

  std::thread opener = gate.open_after(50ms);
  impl().synchronizeEvent(event);
  opener.join();
  CHECK(done->load());
  CHECK(impl().queryEvent(event));

  // A new record is a new version: incomplete again until the stream gets there.
  Gate second;
  launch(stream, second.wait_then());
  record(&event, stream);
  CHECK(!impl().queryEvent(event));
  second.open();
  impl().synchronizeEvent(event);
  CHECK(impl().queryEvent(event));
  impl().destroyEvent(event, 0);
}

// block: the other stream runs nothing past the wait until the event's work ran.
void test_block_orders_streams() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev1);
  const c10::Stream b = impl().getStreamFromGlobalPool(kDev1);
  Gate gate;
  Flag a_done = make_flag();
  Flag b_saw_a_done = make_flag();
  launch(a, gate.wait_then([a_done] {
    std::this_thread::sleep_for(10ms);
    *a_done = true;
  }));
  void* event = nullptr;
  record(&event, a);
  impl().block(event, b);
  launch(b, [a_done, b_saw_a_done] { *b_saw_a_done = a_done->load(); });

  CHECK(stays_false([&] { return impl().queryStream(b); })); // b waits for a
  gate.open();
  impl().synchronizeStream(b);
  CHECK(b_saw_a_done->load());
  impl().destroyEvent(event, 1);
}

// A later record does not move an earlier block: b waits for the version
// recorded when block was called, not for the newer one.
void test_later_record_does_not_move_block() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev0);
  const c10::Stream b = impl().getStreamFromGlobalPool(kDev0);
  Gate first;
  Gate second;
  void* event = nullptr;
  launch(a, first.wait_then());
  record(&event, a); // version 1: after `first`
  impl().block(event, b);
  Flag b_done = make_flag();
  launch(b, [b_done] { *b_done = true; });
  launch(a, second.wait_then());
  record(&event, a); // version 2: after `second`

  first.open();
  CHECK(eventually([&] { return b_done->load(); })); // needs version 1 only
  CHECK(!impl().queryStream(a));                     // version 2 is still pending
  CHECK(!impl().queryEvent(event));
  second.open();
  impl().synchronizeEvent(event);
  CHECK(impl().queryEvent(event));
  impl().destroyEvent(event, 0);
}

void test_block_on_unrecorded_or_own_stream() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev0);
  impl().block(nullptr, a); // never recorded: nothing to wait for
  CHECK(impl().queryStream(a));

  // Waiting on one's own earlier work needs no wait (and must not deadlock).
  void* event = nullptr;
  Gate gate;
  launch(a, gate.wait_then());
  record(&event, a);
  impl().block(event, a);
  Flag after = make_flag();
  launch(a, [after] { *after = true; });
  gate.open();
  impl().synchronizeStream(a);
  CHECK(after->load());
  impl().destroyEvent(event, 0);
}

void test_timing_events() {
  const c10::Stream stream = impl().getStreamFromGlobalPool(kDev1);
  void* start = nullptr;
  void* end = nullptr;
  record(&start, stream, c10::EventFlag::BACKEND_DEFAULT);
  Gate gate;
  launch(stream, gate.wait_then([] { std::this_thread::sleep_for(30ms); }));
  record(&end, stream, c10::EventFlag::BACKEND_DEFAULT);
  // Not reached yet: there is no end time to report.
  CHECK_THROWS(impl().elapsedTime(start, end, 1), "not completed");
  gate.open();
  impl().synchronizeEvent(end);
  // The end was stamped when the stream reached it, after the 30 ms of work.
  const double ms = impl().elapsedTime(start, end, 1);
  CHECK(ms >= 25.0 && ms < 5000.0);
  CHECK(impl().elapsedTime(end, start, 1) <= -25.0);
  impl().destroyEvent(start, 1);
  impl().destroyEvent(end, 1);

  // PYTORCH_DEFAULT records no timing, so there is no elapsed time.
  void* plain_start = nullptr;
  void* plain_end = nullptr;
  record(&plain_start, stream);
  record(&plain_end, stream);
  impl().synchronizeEvent(plain_end);
  CHECK_THROWS(impl().elapsedTime(plain_start, plain_end, 1), "without timing");
  impl().destroyEvent(plain_start, 1);
  impl().destroyEvent(plain_end, 1);
}

void test_destroy_event() {
  impl().destroyEvent(nullptr, 0); // nothing to destroy

  // Destroying an event whose stream has not reached it yet is safe: the
  // runtime keeps what the pending work needs.
  const c10::Stream stream = impl().getStreamFromGlobalPool(kDev0);
  Gate gate;
  launch(stream, gate.wait_then());
  void* event = nullptr;
  record(&event, stream, c10::EventFlag::BACKEND_DEFAULT);
  impl().destroyEvent(event, 0);
  gate.open();
  impl().synchronizeStream(stream);
  CHECK(impl().queryStream(stream));
}

// The same contracts through c10::Event, PyTorch's RAII wrapper.
void test_c10_event() {
  const c10::Stream a = impl().getStreamFromGlobalPool(kDev1);
  const c10::Stream b = impl().getNewStream(kDev1, -1);
  c10::Event start(kOpenReg, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(kOpenReg, c10::EventFlag::BACKEND_DEFAULT);
  CHECK(end.query()); // not recorded yet

  Gate gate;
  start.record(a);
  launch(a, gate.wait_then([] { std::this_thread::sleep_for(5ms); }));
  end.record(a);
  CHECK_EQ(end.device(), kDev1);
  CHECK(!end.query());
  end.block(b);
  Flag b_ran = make_flag();
  launch(b, [b_ran] { *b_ran = true; });
  CHECK(stays_false([&] { return b_ran->load(); }));
  gate.open();
  end.synchronize();
  CHECK(end.query());
  CHECK(start.elapsedTime(end) >= 4.0);
  b.synchronize();
  CHECK(b_ran->load());
}

// ---- group: hooks ----------------------------------------------------------

// Runs first in a fresh process: nothing has touched a device yet.
void test_hooks() {
  CHECK(at::isPrivateUse1HooksRegistered());
  CHECK(hooks().isBuilt());
  CHECK(hooks().isAvailable());
  CHECK_EQ(orIsInitialized(), 0); // isAvailable initializes nothing
  CHECK(!hooks().hasPrimaryContext(0));
  CHECK(!hooks().hasPrimaryContext(1));

  hooks().init();
  CHECK_EQ(orIsInitialized(), 1);
  CHECK(!hooks().hasPrimaryContext(1)); // init creates no context either
  CHECK_EQ(int(hooks().deviceCount()), 2);

  hooks().setCurrentDevice(1);
  CHECK_EQ(int(hooks().getCurrentDevice()), 1);
  CHECK_EQ(impl().getDevice(), kDev1); // the guard sees the same current device
  CHECK_EQ(int(hooks().exchangeDevice(0)), 1);
  CHECK_EQ(int(hooks().getCurrentDevice()), 0);
  CHECK_EQ(int(hooks().maybeExchangeDevice(1)), 0);
  CHECK_EQ(int(hooks().getCurrentDevice()), 1);
  CHECK_EQ(int(hooks().maybeExchangeDevice(1)), 1);
  hooks().setCurrentDevice(0);
  CHECK(!hooks().hasPrimaryContext(1)); // switching devices creates no context

  // First use of a device's resources creates its context, and only its.
  impl().getStreamFromGlobalPool(kDev1);
  CHECK(hooks().hasPrimaryContext(1));
  CHECK(!hooks().hasPrimaryContext(0));
  impl().synchronizeStream(impl().getDefaultStream(kDev0));
  CHECK(hooks().hasPrimaryContext(0));
}

// ---- group: threads --------------------------------------------------------

// The current device and the current streams are per thread.
void test_threads_are_independent() {
  const c10::Stream main_stream = impl().getStreamFromGlobalPool(kDev1);
  impl().setDevice(kDev1);
  impl().exchangeStream(main_stream);

  std::latch set_up(2);
  std::latch checked(2);
  auto worker = [&](c10::Device device, c10::Stream stream) {
    // A new thread starts on device 0 and the default streams.
    CHECK_EQ(impl().getDevice(), kDev0);
    CHECK_EQ(impl().getStream(kDev1), impl().getDefaultStream(kDev1));
    impl().setDevice(device);
    impl().exchangeStream(stream);
    set_up.arrive_and_wait();
    CHECK_EQ(impl().getDevice(), device); // the other thread changed only its own
    CHECK_EQ(impl().getStream(stream.device()), stream);
    checked.arrive_and_wait();
  };
  const c10::Stream s0 = impl().getStreamFromGlobalPool(kDev0);
  const c10::Stream s1 = impl().getStreamFromGlobalPool(kDev1, /*isHighPriority=*/true);
  std::thread first(worker, kDev1, s0);
  std::thread second(worker, kDev0, s1);
  first.join();
  second.join();

  CHECK_EQ(impl().getDevice(), kDev1);
  CHECK_EQ(impl().getStream(kDev1), main_stream);
  CHECK_EQ(impl().getStream(kDev0), impl().getDefaultStream(kDev0));
  impl().exchangeStream(impl().getDefaultStream(kDev1));
  impl().setDevice(kDev0);
}

// 8 threads switch devices and streams and record and wait on events for
// ~2.5 s. Everything must stay consistent, all work must run, and it must end:
// a thread stuck for 30 s is reported as a deadlock.
void test_threads_stress() {
  constexpr int kThreads = 8;
  const auto deadline = Clock::now() + 2500ms;
  std::atomic<long> iterations{0};
  std::atomic<long> inconsistencies{0};
  std::atomic<long> launched{0};
  auto ran = std::make_shared<std::atomic<long>>(0);
  std::atomic<int> finished{0};
  std::mutex finished_mutex;
  std::condition_variable finished_cv;

  auto worker = [&](int seed) {
    long local = 0;
    try {
      for (; Clock::now() < deadline; ++local) {
        const c10::Device device(kOpenReg, static_cast<c10::DeviceIndex>((seed + local) % 2));
        c10::DeviceGuard device_guard(device);
        inconsistencies += impl().getDevice() != device;
        const c10::Stream a = impl().getStreamFromGlobalPool(device, local % 3 == 0);
        const c10::Stream b = impl().getNewStream(device, local % 2 == 0 ? 0 : -1);
        {
          c10::StreamGuard stream_guard(a);
          inconsistencies += impl().getStream(device) != a;
        }
        inconsistencies += impl().getStream(device) != impl().getDefaultStream(device);

        c10::Event event(kOpenReg, local % 4 == 0 ? c10::EventFlag::BACKEND_DEFAULT : c10::EventFlag::PYTORCH_DEFAULT);
        if (local % 16 == 0) {
          launch(a, [ran] { ran->fetch_add(1); });
          ++launched;
        }
        event.record(a);
        event.block(b);
        event.query();
        if (local % 8 == 0) {
          event.synchronize();
          inconsistencies += !event.query();
        }
        if (local % 32 == 0) {
          b.synchronize();
        }
      }
    } catch (const std::exception& e) {
      fail(std::string("stress thread threw: ") + e.what(), __FILE__, __LINE__);
    }
    inconsistencies += impl().getDevice() != kDev0; // every guard restored
    iterations += local;
    {
      std::lock_guard<std::mutex> lock(finished_mutex);
      ++finished;
    }
    finished_cv.notify_all();
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back(worker, i);
  }
  {
    std::unique_lock<std::mutex> lock(finished_mutex);
    if (!finished_cv.wait_for(lock, 30s, [&] { return finished == kThreads; })) {
      std::printf("  FAIL: %d of %d stress threads still running after 30 s: deadlock\n", kThreads - finished.load(),
                  kThreads);
      std::fflush(stdout);
      std::_Exit(1); // the stuck threads cannot be joined
    }
  }
  for (auto& thread : threads) {
    thread.join();
  }
  impl().synchronizeDevice(0);
  impl().synchronizeDevice(1);
  std::printf("  %ld iterations in %d threads, %ld host functions\n", iterations.load(), kThreads, launched.load());
  CHECK(iterations > kThreads * 100L);
  CHECK_EQ(inconsistencies.load(), 0L);
  CHECK_EQ(ran->load(), launched.load()); // all submitted work ran
}

// ---- group: errors ---------------------------------------------------------

void test_out_of_range_devices() {
  const c10::Device dev5(kOpenReg, 5);
  CHECK_THROWS(impl().setDevice(dev5), "index 5", "2 devices");
  CHECK_THROWS(impl().exchangeDevice(dev5), "index 5", "2 devices");
  CHECK_THROWS(c10::DeviceGuard(c10::Device("openreg:7")), "index 7", "2 devices");
  CHECK_THROWS(impl().getStream(c10::Device(kOpenReg, 3)), "index 3", "2 devices");
  CHECK_THROWS(impl().getDefaultStream(c10::Device(kOpenReg, 3)), "index 3");
  CHECK_THROWS(impl().getStreamFromGlobalPool(c10::Device(kOpenReg, 4)), "index 4", "2 devices");
  CHECK_THROWS(impl().getNewStream(c10::Device(kOpenReg, 4), 0), "index 4");
  CHECK_THROWS(impl().getDeviceCapability(dev5), "index 5");
  CHECK_THROWS(impl().synchronizeDevice(6), "index 6", "2 devices");
  CHECK_THROWS(hooks().setCurrentDevice(9), "index 9", "2 devices");
  CHECK_THROWS(hooks().setCurrentDevice(-2), "index -2");
  CHECK_THROWS(hooks().exchangeDevice(3), "index 3");
  CHECK_THROWS(hooks().maybeExchangeDevice(3), "index 3");
  CHECK_THROWS(hooks().hasPrimaryContext(12), "index 12", "2 devices");
  CHECK_EQ(impl().getDevice(), kDev0); // nothing changed on the way
}

void test_cpu_device_handed_to_guard() {
  const c10::Stream cpu_stream(c10::Stream::DEFAULT, kCpu);
  CHECK_THROWS(impl().exchangeDevice(kCpu), "expected an openreg device", "cpu");
  CHECK_THROWS(impl().setDevice(kCpu), "expected an openreg device");
  CHECK_THROWS(impl().getStream(kCpu), "expected an openreg device");
  CHECK_THROWS(impl().getDefaultStream(kCpu), "expected an openreg device");
  CHECK_THROWS(impl().getStreamFromGlobalPool(kCpu), "expected an openreg device");
  CHECK_THROWS(impl().getNewStream(kCpu, 0), "expected an openreg device");
  CHECK_THROWS(impl().getDeviceCapability(kCpu), "expected an openreg device");
  CHECK_THROWS(impl().exchangeStream(cpu_stream), "expected an openreg stream");
  CHECK_THROWS(impl().getStreamNativeHandle(cpu_stream), "expected an openreg stream");
  CHECK_THROWS(impl().queryStream(cpu_stream), "expected an openreg stream");
  CHECK_THROWS(impl().synchronizeStream(cpu_stream), "expected an openreg stream");
  CHECK_THROWS(impl().isStreamCapturing(cpu_stream), "expected an openreg stream");
  void* event = nullptr;
  CHECK_THROWS(record(&event, cpu_stream), "expected an openreg stream");
  CHECK(event == nullptr);
  CHECK_EQ(impl().getDevice(), kDev0);
}

void test_invalid_stream_ids() {
  CHECK_THROWS(impl().queryStream(stream_with_id(kDev0, 65)), "stream id 65", "device 0");
  CHECK_THROWS(impl().exchangeStream(stream_with_id(kDev1, 99)), "stream id 99", "device 1");
  CHECK_THROWS(impl().getStreamNativeHandle(stream_with_id(kDev0, -3)), "stream id -3");
  CHECK_THROWS(impl().synchronizeStream(stream_with_id(kDev1, 1000)), "stream id 1000");
  CHECK_THROWS(impl().isStreamCapturing(stream_with_id(c10::Device(kOpenReg, 5), 0)), "index 5");
  CHECK_EQ(impl().getStream(kDev1), impl().getDefaultStream(kDev1)); // unchanged
}

void test_events_across_devices() {
  const c10::Stream on0 = impl().getStreamFromGlobalPool(kDev0);
  const c10::Stream on1 = impl().getStreamFromGlobalPool(kDev1);

  // Waiting on an event of another device is allowed, as cudaStreamWaitEvent
  // allows it; on1's later work waits for on0's recorded point.
  c10::Event event(kOpenReg);
  Gate gate;
  Flag on0_done = make_flag();
  Flag on1_saw_on0_done = make_flag();
  launch(on0, gate.wait_then([on0_done] { *on0_done = true; }));
  event.record(on0);
  event.block(on1);
  impl().block(event.eventId(), on1);
  launch(on1, [on0_done, on1_saw_on0_done] { *on1_saw_on0_done = on0_done->load(); });
  CHECK(stays_false([&] { return impl().queryStream(on1); })); // on1 waits for on0
  gate.open();
  impl().synchronizeStream(on1);
  CHECK(on1_saw_on0_done->load());
  CHECK_EQ(event.device_index(), c10::DeviceIndex(0)); // waiting does not move it

  // Recording an event of device 0 on a stream of device 1. The failed
  // record still creates the event (owned by `stray`), never recorded.
  CHECK_THROWS(event.record(on1), "device 0", "cannot be recorded");
  void* stray = nullptr;
  CHECK_THROWS(impl().record(&stray, on1, /*device_index=*/0, c10::EventFlag::BACKEND_DEFAULT), "cannot be recorded");
  CHECK(stray != nullptr);

  // Elapsed time needs two recorded, timing events of one device.
  void* timed0 = nullptr;
  void* timed1 = nullptr;
  void* plain0 = nullptr;
  record(&timed0, on0, c10::EventFlag::BACKEND_DEFAULT);
  record(&timed1, on1, c10::EventFlag::BACKEND_DEFAULT);
  record(&plain0, on0);
  impl().synchronizeDevice(0);
  impl().synchronizeDevice(1);
  CHECK_THROWS(impl().elapsedTime(stray, timed0, 0), "start event has not been recorded");
  CHECK_THROWS(impl().elapsedTime(timed0, stray, 0), "end event has not been recorded");
  CHECK_THROWS(impl().elapsedTime(nullptr, timed0, 0), "null openreg event");
  CHECK_THROWS(impl().elapsedTime(plain0, timed0, 0), "without timing");
  CHECK_THROWS(impl().elapsedTime(timed0, plain0, 0), "without timing");
  CHECK_THROWS(impl().elapsedTime(timed0, timed1, 0), "different openreg devices");
  CHECK_THROWS(impl().elapsedTime(timed0, timed0, 5), "index 5");
  CHECK_EQ(impl().elapsedTime(timed0, timed0, 0), 0.0);
  for (void* e : {stray, timed0, timed1, plain0}) {
    impl().destroyEvent(e, 0);
  }

  // Destroyed handles are rejected, never dereferenced (Note [Event handles]);
  // destroyEvent is noexcept: a second destroy is ignored with a warning.
  CHECK_THROWS(impl().queryEvent(timed0), "not a live openreg event handle");
  CHECK_THROWS(impl().block(timed0, on0), "not a live openreg event handle");
  CHECK_THROWS(impl().synchronizeEvent(timed0), "not a live openreg event handle");
  CHECK_THROWS(record(&timed0, on0), "not a live openreg event handle");
  impl().destroyEvent(timed0, 0);
  impl().destroyEvent(reinterpret_cast<void*>(0x1234), 0);
}

// ---- group: no_devices (run with OPENREG_DEVICE_COUNT=0 or invalid) --------

// Without devices nothing throws where the contracts forbid it: deviceCount
// reports 0 (also for a misconfigured count), isAvailable is false; using a
// device is an error that says there are none.
void test_no_devices() {
  CHECK_EQ(int(impl().deviceCount()), 0);
  CHECK_EQ(int(hooks().deviceCount()), 0);
  CHECK(!hooks().isAvailable());
  CHECK(hooks().isBuilt());
  CHECK_EQ(c10::Device("openreg:0"), kDev0); // the name is still registered
  CHECK_THROWS(impl().setDevice(kDev0), "index 0", "no openreg devices");
  CHECK_THROWS(impl().getStreamFromGlobalPool(kDev0), "no openreg devices");
  CHECK_THROWS(hooks().hasPrimaryContext(0), "no openreg devices");
  impl().uncheckedSetDevice(kDev1); // must not throw
  CHECK_EQ(impl().getDevice(), kDev0);
}

// ---- groups and the runner -------------------------------------------------

struct Test {
  const char* name;
  void (*run)();
};

struct Group {
  const char* name;
  int devices; // the OPENREG_DEVICE_COUNT the group is written for
  std::vector<Test> tests;
};

const std::vector<Group>& groups() {
  // hooks first: under "all" it still runs before anything creates a context.
  static const std::vector<Group> all = {
      {"hooks", 2, {{"hooks", test_hooks}}},
      {"device",
       2,
       {{"type and count", test_type_and_count},
        {"get/set/exchange device", test_get_set_exchange_device},
        {"uncheckedSetDevice", test_unchecked_set_device},
        {"c10::DeviceGuard", test_device_guard},
        {"getDeviceCapability", test_device_capability}}},
      {"streams",
       2,
       {{"current and default streams", test_current_and_default_streams},
        {"pool streams and priorities", test_pool_streams_and_priorities},
        {"getNewStream round-robin", test_get_new_stream_round_robin},
        {"exchangeStream", test_exchange_stream},
        {"getStreamNativeHandle", test_native_handles},
        {"queryStream and synchronizeStream", test_query_and_synchronize_stream},
        {"isStreamCapturing", test_is_stream_capturing},
        {"synchronizeDevice", test_synchronize_device}}},
      {"events",
       2,
       {{"record/query/synchronize", test_record_query_synchronize_event},
        {"block orders streams", test_block_orders_streams},
        {"a later record does not move a block", test_later_record_does_not_move_block},
        {"block on unrecorded event or own stream", test_block_on_unrecorded_or_own_stream},
        {"timing events and elapsedTime", test_timing_events},
        {"destroyEvent", test_destroy_event},
        {"c10::Event", test_c10_event}}},
      {"threads",
       2,
       {{"threads are independent", test_threads_are_independent},
        {"8 threads under load", test_threads_stress}}},
      {"errors",
       2,
       {{"out-of-range devices", test_out_of_range_devices},
        {"a CPU device handed to the guard", test_cpu_device_handed_to_guard},
        {"invalid stream ids", test_invalid_stream_ids},
        {"events across devices", test_events_across_devices}}},
      {"no_devices", 0, {{"no devices", test_no_devices}}},
  };
  return all;
}

void run_group(const Group& group) {
  for (const Test& test : group.tests) {
    std::printf("[%s] %s\n", group.name, test.name);
    std::fflush(stdout);
    const int failed_before = failed.load();
    try {
      test.run();
    } catch (const std::exception& e) {
      fail(std::string("unexpected exception: ") + e.what(), __FILE__, __LINE__);
    }
    // Leave no work or state behind for the next test.
    try {
      for (c10::DeviceIndex device = 0; device < impl().deviceCount(); ++device) {
        impl().synchronizeDevice(device);
      }
    } catch (const std::exception& e) {
      fail(std::string("synchronizing after the test failed: ") + e.what(), __FILE__, __LINE__);
    }
    impl().uncheckedSetDevice(kDev0);
    if (failed.load() != failed_before) {
      std::printf("  -> FAILED\n");
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  const std::string wanted = argc > 1 ? argv[1] : "all";
  // Loading libtorch_openreg.so must have registered the backend.
  if (!c10::impl::hasDeviceGuardImpl(kOpenReg) || c10::get_privateuse1_backend() != "openreg") {
    std::printf("openreg is not registered: libtorch_openreg.so was not loaded\n");
    return 1;
  }
  // "all": every group written for the device count in force.
  const int devices = impl().deviceCount();
  bool ran = false;
  for (const Group& group : groups()) {
    if (wanted == group.name) {
      if (group.devices != devices) {
        std::printf("group %s needs OPENREG_DEVICE_COUNT=%d, not %d\n", group.name, group.devices, devices);
        return 2;
      }
    } else if (wanted != "all" || group.devices != devices) {
      continue;
    }
    ran = true;
    run_group(group);
  }
  if (!ran) {
    std::printf("no group \"%s\" for %d devices; groups: hooks device streams events threads errors "
                "(2 devices), no_devices (0), all\n",
                wanted.c_str(), devices);
    return 2;
  }
  std::printf("%d passed, %d failed\n", passed.load(), failed.load());
  return failed.load() == 0 ? 0 : 1;
}
