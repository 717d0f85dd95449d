// The parts of torch_openreg._C that share device memory between processes
// (torch_openreg/_multiprocessing.py, Note [Sharing device memory between
// processes] there): exporting and opening device memory over the C ABI
// (Note [Shareable device memory] in src/memory/device_memory.rs), one-shot interprocess
// signals on streams, made of pipes, and interprocess events.
#include <Python.h>

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>

#include "openreg.h"

namespace {

void check(int code, const char* what) {
  if (code != orSuccess) {
    const char* detail = orGetLastErrorMessage();
    TORCH_CHECK(false, what, ": ", detail && detail[0] ? detail : orGetErrorString(code));
  }
}

// What a received storage's deleter releases: the mapping, and the write end
// of the pipe whose closing tells the sender that this holder is gone.
struct ReceivedMemory {
  void* base;
  int holder_fd;
};

void release_received_memory(void* context) {
  auto* received = static_cast<ReceivedMemory*>(context);
  orIpcCloseMemHandle(received->base);
  close(received->holder_fd);
  delete received;
}

// Host functions on a stream: the sender's writes one byte and closes its
// end; the receiver's waits until that byte arrives or the sender's end is
// closed some other way (the sender exited), then closes its end.
void signal_pipe(void* fd) {
  const int write_end = static_cast<int>(reinterpret_cast<intptr_t>(fd));
  const char byte = 1;
  while (write(write_end, &byte, 1) < 0 && errno == EINTR) {
  }
  close(write_end);
}

void wait_for_pipe(void* fd) {
  const int read_end = static_cast<int>(reinterpret_cast<intptr_t>(fd));
  pollfd waiting{read_end, POLLIN, 0};
  while (poll(&waiting, 1, -1) < 0 && errno == EINTR) {
  }
  close(read_end);
}

// Launches `fn(fd)` on the current stream of `device`; `fd` is closed if
// that fails (the host function owns it otherwise).
void launch_with_fd(int device, orHostFn_t fn, int fd) {
  orStream_t stream = nullptr;
  int code = orStreamGetCurrent(device, &stream);
  if (code == orSuccess) {
    Py_BEGIN_ALLOW_THREADS // OPENREG_LAUNCH_BLOCKING=1 waits for the launch
    code = orLaunchHostFunc(stream, fn, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
    Py_END_ALLOW_THREADS
  }
  if (code != orSuccess) {
    close(fd);
    check(code, "openreg IPC: launching a stream signal failed");
  }
}

// Note [Interprocess events]: an interprocess event is a page of memory
// shared between processes (a memory file, opened by each) holding two
// counters: `recorded`, bumped by each record, and `completed`, raised to a
// record's number by its stream when the stream gets there. A wait (a
// stream's, or the host's) captures `recorded` at the call, as any event
// wait captures the point current at the call, and polls until `completed`
// reaches it. Lock-free 64-bit atomics work on memory shared between
// processes. Host functions hold the mapping while they are queued.
class SharedEventPage {
 public:
  explicit SharedEventPage(int fd) {
    void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    TORCH_CHECK(page != MAP_FAILED, "openreg IPC: cannot map an interprocess event: ", std::strerror(errno));
    counters_ = static_cast<uint64_t*>(page);
  }
  ~SharedEventPage() {
    munmap(counters_, kPageBytes);
  }
  SharedEventPage(const SharedEventPage&) = delete;
  SharedEventPage& operator=(const SharedEventPage&) = delete;

  std::atomic_ref<uint64_t> recorded() const {
    return std::atomic_ref<uint64_t>(counters_[0]);
  }
  std::atomic_ref<uint64_t> completed() const {
    return std::atomic_ref<uint64_t>(counters_[1]);
  }
  bool reached(uint64_t record) const {
    return completed().load() >= record;
  }
  void wait_until_reached(uint64_t record) const {
    auto pause = std::chrono::microseconds(20);
    while (!reached(record)) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
  static constexpr size_t kPageBytes = 4096;

 private:
  uint64_t* counters_ = nullptr;
};
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);

using SharedEvent = std::shared_ptr<SharedEventPage>;

// A host function's view of an event: the page, and the record it is about.
struct EventPoint {
  SharedEvent event;
  uint64_t record;
};

void complete_record(void* context) {
  std::unique_ptr<EventPoint> point(static_cast<EventPoint*>(context));
  uint64_t seen = point->event->completed().load();
  while (seen < point->record && !point->event->completed().compare_exchange_weak(seen, point->record)) {
  }
}

void wait_for_record(void* context) {
  std::unique_ptr<EventPoint> point(static_cast<EventPoint*>(context));
  point->event->wait_until_reached(point->record);
}

constexpr const char* kEventCapsule = "torch_openreg.InterprocessEvent";

SharedEvent& event_of(PyObject* capsule) {
  auto* event = static_cast<SharedEvent*>(PyCapsule_GetPointer(capsule, kEventCapsule));
  if (event == nullptr) {
    throw python_error();
  }
  return *event;
}

// Launches `fn` about (`event`, `record`) on the current stream of `device`.
void launch_event_point(int device, orHostFn_t fn, const SharedEvent& event, uint64_t record) {
  auto point = std::make_unique<EventPoint>(EventPoint{event, record});
  orStream_t stream = nullptr;
  int code = orStreamGetCurrent(device, &stream);
  if (code == orSuccess) {
    Py_BEGIN_ALLOW_THREADS
    code = orLaunchHostFunc(stream, fn, point.get());
    Py_END_ALLOW_THREADS
  }
  check(code, "openreg IPC: launching on a stream for an interprocess event failed");
  point.release(); // the host function owns it now
}

} // namespace

// _ipc_event_open(fd) -> capsule: the interprocess event whose page is the
// memory file `fd` (which the caller keeps).
extern "C" PyObject* openreg_ipc_event_open(PyObject* self, PyObject* arg) {
  HANDLE_TH_ERRORS
  const long fd = PyLong_AsLong(arg);
  if (PyErr_Occurred())
    return nullptr;
  auto* event = new SharedEvent(std::make_shared<SharedEventPage>(static_cast<int>(fd)));
  return PyCapsule_New(event, kEventCapsule, [](PyObject* capsule) {
    delete static_cast<SharedEvent*>(PyCapsule_GetPointer(capsule, kEventCapsule));
  });
  END_HANDLE_TH_ERRORS
}

// _ipc_event_record(capsule, device): a new record, completed when the
// current stream of `device` gets here.
extern "C" PyObject* openreg_ipc_event_record(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject* capsule = nullptr;
  int device = 0;
  if (!PyArg_ParseTuple(args, "Oi", &capsule, &device))
    return nullptr;
  const SharedEvent& event = event_of(capsule);
  launch_event_point(device, complete_record, event, event->recorded().fetch_add(1) + 1);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// _ipc_event_wait(capsule, device): the current stream of `device` waits
// for the latest record (in any process) to complete.
extern "C" PyObject* openreg_ipc_event_wait(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject* capsule = nullptr;
  int device = 0;
  if (!PyArg_ParseTuple(args, "Oi", &capsule, &device))
    return nullptr;
  const SharedEvent& event = event_of(capsule);
  const uint64_t record = event->recorded().load();
  if (!event->reached(record)) {
    launch_event_point(device, wait_for_record, event, record);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// _ipc_event_query(capsule) -> whether the latest record has completed.
extern "C" PyObject* openreg_ipc_event_query(PyObject* self, PyObject* capsule) {
  HANDLE_TH_ERRORS
  const SharedEvent& event = event_of(capsule);
  return PyBool_FromLong(event->reached(event->recorded().load()));
  END_HANDLE_TH_ERRORS
}

// _ipc_event_synchronize(capsule): the host waits for the latest record.
extern "C" PyObject* openreg_ipc_event_synchronize(PyObject* self, PyObject* capsule) {
  HANDLE_TH_ERRORS
  SharedEvent event = event_of(capsule);
  const uint64_t record = event->recorded().load();
  Py_BEGIN_ALLOW_THREADS
  event->wait_until_reached(record);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// _ipc_mem_handle(data_ptr) -> (fd, mapping_size, offset): the memory file
// behind device memory at data_ptr (the runtime keeps the descriptor).
extern "C" PyObject* openreg_ipc_mem_handle(PyObject* self, PyObject* arg) {
  HANDLE_TH_ERRORS
  void* ptr = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred())
    return nullptr;
  int fd = -1;
  size_t mapping_size = 0, offset = 0;
  check(orIpcGetMemHandle(&fd, &mapping_size, &offset, ptr), "openreg IPC: cannot share device memory");
  return Py_BuildValue("(inn)", fd, (Py_ssize_t)mapping_size, (Py_ssize_t)offset);
  END_HANDLE_TH_ERRORS
}

// _ipc_open_storage(device, fd, mapping_size, offset, nbytes, holder_fd):
// an UntypedStorage of `nbytes` on openreg:device over the shared memory at
// `offset` in the mapping of memory file `fd` (which the caller keeps). Once
// it returns, the storage owns `holder_fd` and closes it when released.
extern "C" PyObject* openreg_ipc_open_storage(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  int device = 0, fd = -1, holder_fd = -1;
  Py_ssize_t mapping_size = 0, offset = 0, nbytes = 0;
  if (!PyArg_ParseTuple(args, "iinnni", &device, &fd, &mapping_size, &offset, &nbytes, &holder_fd))
    return nullptr;
  TORCH_CHECK(
      offset >= 0 && nbytes >= 0 && offset + nbytes <= mapping_size, "openreg IPC: a storage of ", nbytes,
      " bytes at offset ", offset, " does not fit in a shared mapping of ", mapping_size, " bytes");
  void* base = nullptr;
  check(orIpcOpenMemHandle(&base, fd, static_cast<size_t>(mapping_size)), "openreg IPC: cannot open shared memory");
  auto* received = new ReceivedMemory{base, holder_fd};
  c10::DataPtr data(
      static_cast<char*>(base) + offset, received, &release_received_memory,
      c10::Device(c10::kPrivateUse1, static_cast<c10::DeviceIndex>(device)));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), /*allocator=*/nullptr, /*resizable=*/false));
  return THPStorage_Wrap(std::move(storage));
  END_HANDLE_TH_ERRORS
}

// _ipc_signal_when_reached(device, fd): when the current stream of `device`
// reaches this point, write a byte to pipe end `fd` and close it (owned now).
extern "C" PyObject* openreg_ipc_signal_when_reached(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  int device = 0, fd = -1;
  if (!PyArg_ParseTuple(args, "ii", &device, &fd))
    return nullptr;
  launch_with_fd(device, signal_pipe, fd);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// _ipc_wait_for_signal(device, fd): the current stream of `device` waits
// here until pipe end `fd` (owned now) is signalled or closed by the sender.
extern "C" PyObject* openreg_ipc_wait_for_signal(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  int device = 0, fd = -1;
  if (!PyArg_ParseTuple(args, "ii", &device, &fd))
    return nullptr;
  launch_with_fd(device, wait_for_pipe, fd);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}
