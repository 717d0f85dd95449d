// torch_openreg._C: the Python bindings the torch_openreg package uses.
// CPython over the C ABI of include/openreg.h (generators through ATen:
// generator.cpp); every failure becomes a RuntimeError carrying the
// runtime's message.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <climits>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "openreg.h"

// In generator.cpp (which needs torch's Python headers).
extern "C" PyObject* openreg_get_default_generator(PyObject* self, PyObject* arg);
extern "C" void openreg_register_fork_handler();
// In src/diagnostics/dtype_record.rs (Note [Dtype policy] in cpp/ops/dtype_policy.h).
extern "C" const char* orTakeRecordedKernelDtypes(void);
// In ipc.cpp (sharing device memory between processes).
extern "C" PyObject* openreg_ipc_mem_handle(PyObject* self, PyObject* arg);
extern "C" PyObject* openreg_ipc_open_storage(PyObject* self, PyObject* args);
extern "C" PyObject* openreg_ipc_signal_when_reached(PyObject* self, PyObject* args);
extern "C" PyObject* openreg_ipc_wait_for_signal(PyObject* self, PyObject* args);
extern "C" PyObject* openreg_ipc_event_open(PyObject* self, PyObject* arg);
extern "C" PyObject* openreg_ipc_event_record(PyObject* self, PyObject* args);
extern "C" PyObject* openreg_ipc_event_wait(PyObject* self, PyObject* args);
extern "C" PyObject* openreg_ipc_event_query(PyObject* self, PyObject* arg);
extern "C" PyObject* openreg_ipc_event_synchronize(PyObject* self, PyObject* arg);

// Reads a device index, rejecting values that do not fit an int (they would
// otherwise be truncated into a valid-looking index).
static bool parse_device(PyObject* arg, int* device) {
  long long value = PyLong_AsLongLong(arg);
  if (value == -1 && PyErr_Occurred())
    return false;
  if (value < INT_MIN || value > INT_MAX) {
    int count = 0;
    orGetDeviceCount(&count);
    PyErr_Format(
        PyExc_RuntimeError, "openreg device index %lld is out of range: there are %d devices", value, count);
    return false;
  }
  *device = (int)value;
  return true;
}

// Out of device memory is torch.OutOfMemoryError (a RuntimeError), as for
// allocations through PyTorch; everything else a RuntimeError.
static PyObject* raise_error(int code) {
  const char* detail = orGetLastErrorMessage();
  PyObject* type = PyExc_RuntimeError;
  PyObject* torch = NULL;
  PyObject* oom = NULL;
  if (code == orErrorMemoryAllocation && (torch = PyImport_ImportModule("torch")) != NULL)
    oom = PyObject_GetAttrString(torch, "OutOfMemoryError");
  PyErr_Clear();
  if (oom)
    type = oom;
  PyErr_SetString(type, detail && detail[0] ? detail : orGetErrorString(code));
  Py_XDECREF(oom);
  Py_XDECREF(torch);
  return NULL;
}

#define CHECK(call)                \
  do {                             \
    int code_ = (call);            \
    if (code_ != orSuccess)        \
      return raise_error(code_);   \
  } while (0)

static PyObject* device_count(PyObject* self, PyObject* unused) {
  int count = 0;
  CHECK(orGetDeviceCount(&count));
  return PyLong_FromLong(count);
}

static PyObject* get_device(PyObject* self, PyObject* unused) {
  int device = 0;
  CHECK(orGetDevice(&device));
  return PyLong_FromLong(device);
}

static PyObject* set_device(PyObject* self, PyObject* arg) {
  int device = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orSetDevice(device));
  Py_RETURN_NONE;
}

static PyObject* exchange_device(PyObject* self, PyObject* arg) {
  int device = 0, previous = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orGetDevice(&previous));
  if (device != previous)
    CHECK(orSetDevice(device));
  return PyLong_FromLong(previous);
}

static PyObject* init(PyObject* self, PyObject* unused) {
  CHECK(orInit());
  Py_RETURN_NONE;
}

static PyObject* is_initialized(PyObject* self, PyObject* unused) {
  return PyBool_FromLong(orIsInitialized());
}

static PyObject* is_in_bad_fork(PyObject* self, PyObject* unused) {
  return PyBool_FromLong(orIsInBadFork());
}

static PyObject* has_primary_context(PyObject* self, PyObject* arg) {
  int device = 0, has = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orDeviceHasPrimaryContext(device, &has));
  return PyBool_FromLong(has);
}

// Collects c10 warnings (TORCH_WARN) instead of printing them.
struct CollectWarnings final : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
};

// Re-issues collected warnings as Python UserWarnings; false if one became
// an exception (-W error).
static bool warn_in_python(const CollectWarnings& collected) {
  for (const std::string& message : collected.messages) {
    if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0)
      return false;
  }
  return true;
}

// synchronize(device): waits for every stream of `device`, without the GIL.
// Its sync-debug warning (Note [Sync debug]) becomes a Python warning.
static PyObject* synchronize(PyObject* self, PyObject* arg) {
  int device = 0, previous = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orGetDevice(&previous));
  CHECK(orSetDevice(device));
  int code;
  CollectWarnings collected;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&collected);
    Py_BEGIN_ALLOW_THREADS
    code = orDeviceSynchronize();
    Py_END_ALLOW_THREADS
  }
  orSetDevice(previous);
  if (!warn_in_python(collected))
    return NULL;
  CHECK(code);
  Py_RETURN_NONE;
}

static PyObject* set_memory_fraction(PyObject* self, PyObject* args) {
  PyObject* device_arg;
  double fraction;
  int device = 0;
  if (!PyArg_ParseTuple(args, "Od", &device_arg, &fraction) || !parse_device(device_arg, &device))
    return NULL;
  CHECK(orSetMemoryFraction(device, fraction));
  Py_RETURN_NONE;
}

static PyObject* device_properties(PyObject* self, PyObject* arg) {
  int device = 0;
  if (!parse_device(arg, &device))
    return NULL;
  orDeviceProp prop;
  CHECK(orGetDeviceProperties(&prop, device));
  return Py_BuildValue(
      "{s:s,s:i,s:i,s:i,s:K,s:y#}", "name", prop.name, "major", prop.major, "minor", prop.minor,
      "multi_processor_count", prop.multiProcessorCount, "total_memory", (unsigned long long)prop.totalGlobalMem,
      "uuid", (const char*)prop.uuid, (Py_ssize_t)sizeof(prop.uuid));
}

static PyObject* live_worker_count(PyObject* self, PyObject* arg) {
  int device = 0, count = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orDeviceGetLiveWorkerCount(device, &count));
  return PyLong_FromLong(count);
}

static PyObject* stream_priority_range(PyObject* self, PyObject* unused) {
  int least = 0, greatest = 0;
  CHECK(orDeviceGetStreamPriorityRange(&least, &greatest));
  return Py_BuildValue("(ii)", least, greatest);
}

static PyObject* stop_device(PyObject* self, PyObject* arg) {
  int device = 0;
  if (!parse_device(arg, &device))
    return NULL;
  int code;
  // Without the GIL: abandoning drops no Python object, but takes every
  // stream's lock, which a worker holding the GIL might be waiting behind.
  Py_BEGIN_ALLOW_THREADS
  code = orDeviceStop(device);
  Py_END_ALLOW_THREADS
  CHECK(code);
  Py_RETURN_NONE;
}

static PyObject* restart_device(PyObject* self, PyObject* arg) {
  int device = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orDeviceRestart(device));
  Py_RETURN_NONE;
}

static PyObject* is_device_stopped(PyObject* self, PyObject* arg) {
  int device = 0, stopped = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orDeviceIsStopped(device, &stopped));
  return PyBool_FromLong(stopped);
}

static PyObject* options(PyObject* self, PyObject* unused) {
  return PyUnicode_FromString(orGetOptions());
}

/* Under OPENREG_DTYPES=record: "op\tdtype\tcomputed-in" lines of the kernel
 * calls since the last call (scripts/generate_dtype_table.py). */
static PyObject* recorded_kernel_dtypes(PyObject* self, PyObject* unused) {
  return PyUnicode_FromString(orTakeRecordedKernelDtypes());
}

static void sleep_on_stream(void* nanoseconds) {
  long long ns = (long long)(intptr_t)nanoseconds;
  struct timespec t = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
  while (nanosleep(&t, &t) != 0) {
  }
}

/* _sleep(ms): queue a kernel that keeps the current stream busy for `ms`
 * milliseconds (like torch.cuda._sleep), for testing asynchrony. */
static PyObject* sleep_kernel(PyObject* self, PyObject* arg) {
  double ms = PyFloat_AsDouble(arg);
  if (PyErr_Occurred())
    return NULL;
  if (!(ms >= 0 && ms <= 600000)) {
    PyErr_Format(PyExc_ValueError, "_sleep: duration must be within 0..600000 ms, got %S", arg);
    return NULL;
  }
  orStream_t stream;
  CHECK(orStreamGetCurrent(-1, &stream));
  int code;
  // Without the GIL: with OPENREG_LAUNCH_BLOCKING=1 the launch waits.
  Py_BEGIN_ALLOW_THREADS
  code = orLaunchHostFuncNamed(stream, sleep_on_stream, (void*)(intptr_t)(ms * 1e6), "torch.openreg._sleep");
  Py_END_ALLOW_THREADS
  CHECK(code);
  Py_RETURN_NONE;
}

/* _prepare_exit(): registered with atexit when the package is imported, so
 * CPython runs it before it finalizes: drains every stream and stops kernels
 * from releasing captures after that (Note [Host exit] in src/runtime/lifecycle.rs).
 * Without the GIL: a kernel's captures may need it to be released. */
static PyObject* prepare_exit(PyObject* self, PyObject* unused) {
  int code;
  Py_BEGIN_ALLOW_THREADS
  code = orPrepareHostExit();
  Py_END_ALLOW_THREADS
  CHECK(code);
  Py_RETURN_NONE;
}

static PyObject* utilization(PyObject* self, PyObject* arg) {
  int device = 0, percent = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orDeviceGetUtilization(device, &percent));
  return PyLong_FromLong(percent);
}

static PyObject* graph_pool_handle(PyObject* self, PyObject* unused) {
  uint64_t first = 0, second = 0;
  CHECK(orGraphPoolHandle(&first, &second));
  return Py_BuildValue("(KK)", (unsigned long long)first, (unsigned long long)second);
}

static PyObject* is_current_stream_capturing(PyObject* self, PyObject* arg) {
  int device = 0, capturing = 0;
  orStream_t stream = NULL;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orStreamGetCurrent(device, &stream));
  CHECK(orStreamIsCapturing(stream, &capturing));
  return PyBool_FromLong(capturing);
}

static PyObject* can_access_peer(PyObject* self, PyObject* args) {
  PyObject *device_arg, *peer_arg;
  int device = 0, peer = 0, can = 0;
  if (!PyArg_ParseTuple(args, "OO", &device_arg, &peer_arg) || !parse_device(device_arg, &device) ||
      !parse_device(peer_arg, &peer))
    return NULL;
  CHECK(orDeviceCanAccessPeer(&can, device, peer));
  return PyBool_FromLong(can);
}

static PyObject* get_memory_fraction(PyObject* self, PyObject* arg) {
  int device = 0;
  double fraction = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orGetMemoryFraction(device, &fraction));
  return PyFloat_FromDouble(fraction);
}

static PyObject* set_sync_debug_mode(PyObject* self, PyObject* arg) {
  long mode = PyLong_AsLong(arg);
  if (mode == -1 && PyErr_Occurred())
    return NULL;
  CHECK(orSetSyncDebugMode((int)mode));
  Py_RETURN_NONE;
}

static PyObject* get_sync_debug_mode(PyObject* self, PyObject* unused) {
  return PyLong_FromLong(orGetSyncDebugMode());
}

/* The stream sanitizer (torch.openreg.sanitizer). */
static PyObject* sanitizer_set_mode(PyObject* self, PyObject* arg) {
  long mode = PyLong_AsLong(arg);
  if (mode == -1 && PyErr_Occurred())
    return NULL;
  CHECK(orSanitizerSetMode((int)mode));
  Py_RETURN_NONE;
}

static PyObject* sanitizer_mode(PyObject* self, PyObject* unused) {
  return PyLong_FromLong(orSanitizerGetMode());
}

/* {kind: count} */
static PyObject* sanitizer_counts(PyObject* self, PyObject* unused) {
  uint64_t counts[8] = {0};
  CHECK(orSanitizerGetCounts(counts, 8));
  PyObject* result = PyDict_New();
  for (size_t kind = 0; result && orSanitizerGetKindName(kind); ++kind) {
    PyObject* count = PyLong_FromUnsignedLongLong(counts[kind]);
    if (!count || PyDict_SetItemString(result, orSanitizerGetKindName(kind), count) < 0) {
      Py_XDECREF(count);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(count);
  }
  return result;
}

static PyObject* sanitizer_reports(PyObject* self, PyObject* unused) {
  size_t count = orSanitizerGetReportCount();
  PyObject* result = PyList_New(0);
  for (size_t i = 0; result && i < count; ++i) {
    const char* text = NULL;
    if (orSanitizerGetReport(i, &text) != orSuccess)
      break; /* cleared meanwhile by another thread */
    PyObject* item = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    if (!item || PyList_Append(result, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(item);
  }
  return result;
}

static PyObject* sanitizer_clear(PyObject* self, PyObject* unused) {
  Py_BEGIN_ALLOW_THREADS orSanitizerClear();
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* Directories whose frames are library code, not the user's: a report names
 * the innermost frame outside them. */
static std::vector<std::string> library_roots;

/* The sanitizer's source collector: "file:line" of the innermost Python
 * frame outside the library roots. Torch calls ops with the GIL released,
 * so it takes the GIL, as python_stack does; threads Python never ran on
 * (stream workers) have no frames and return at once. The runtime calls it
 * holding none of its locks. */
static const char* python_source_line(void) {
  static thread_local std::string text;
  if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == NULL)
    return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  const char* found = NULL;
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  while (frame && !found) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* filename = PyObject_GetAttrString((PyObject*)code, "co_filename");
    const char* file = filename ? PyUnicode_AsUTF8(filename) : NULL;
    bool library = file == NULL || file[0] == '<';
    for (size_t i = 0; file && !library && i < library_roots.size(); ++i)
      library = strncmp(file, library_roots[i].c_str(), library_roots[i].size()) == 0;
    if (!library) {
      text = std::string(file) + ":" + std::to_string(PyFrame_GetLineNumber(frame));
      found = text.c_str();
    }
    Py_XDECREF(filename);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
  return found;
}

/* _sanitizer_set_library_roots([dir, ...]): installs the source collector. */
static PyObject* sanitizer_set_library_roots(PyObject* self, PyObject* arg) {
  std::vector<std::string> roots;
  PyObject* iterator = PyObject_GetIter(arg);
  if (!iterator)
    return NULL;
  while (PyObject* item = PyIter_Next(iterator)) {
    const char* text = PyUnicode_AsUTF8(item);
    if (text)
      roots.emplace_back(text);
    Py_DECREF(item);
    if (!text)
      break;
  }
  Py_DECREF(iterator);
  if (PyErr_Occurred())
    return NULL;
  library_roots = std::move(roots);
  orSanitizerSetSourceCollector(python_source_line);
  Py_RETURN_NONE;
}

/* _malloc(size) / _free(ptr): device memory from the caching allocator, for
 * the current stream of the current device (caching_allocator_alloc). */
static PyObject* device_malloc(PyObject* self, PyObject* arg) {
  unsigned long long size = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred())
    return NULL;
  void* ptr = NULL;
  CHECK(orMalloc(&ptr, (size_t)size));
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)ptr);
}

static PyObject* device_free(PyObject* self, PyObject* arg) {
  unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred())
    return NULL;
  CHECK(orFree((void*)(uintptr_t)ptr));
  Py_RETURN_NONE;
}

/* _stream_of_handle(handle): (device, id) of a native stream handle
 * (ExternalStream); a handle that is not a stream is an error. */
static PyObject* stream_of_handle(PyObject* self, PyObject* arg) {
  unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred())
    return NULL;
  int device = 0;
  int64_t id = 0;
  CHECK(orStreamGetId((orStream_t)(uintptr_t)handle, &device, &id));
  return Py_BuildValue("(iL)", device, (long long)id);
}

/* The stack collector of memory history: the calling thread's Python
 * frames, innermost first, one "file<TAB>line<TAB>function" per line. Torch
 * ops run without the GIL, so it takes the GIL (as PyTorch's CUDA allocator
 * does for its stacks), but only on a thread that Python knows: never on a
 * stream worker, nor once the interpreter finalizes (NULL then). */
static const char* python_stack(void) {
  static thread_local std::string text;
  if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == NULL)
    return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  text.clear();
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* filename = PyObject_GetAttrString((PyObject*)code, "co_filename");
    PyObject* name = PyObject_GetAttrString((PyObject*)code, "co_name");
    const char* file_text = filename ? PyUnicode_AsUTF8(filename) : NULL;
    const char* name_text = name ? PyUnicode_AsUTF8(name) : NULL;
    text += file_text ? file_text : "?";
    text += '\t';
    text += std::to_string(PyFrame_GetLineNumber(frame));
    text += '\t';
    text += name_text ? name_text : "?";
    text += '\n';
    Py_XDECREF(filename);
    Py_XDECREF(name);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
  return text.c_str();
}

/* _record_memory_history(enabled, trace, stacks, max_entries) */
static PyObject* record_memory_history(PyObject* self, PyObject* args) {
  int enabled, trace, stacks;
  unsigned long long max_entries;
  if (!PyArg_ParseTuple(args, "ppiK", &enabled, &trace, &stacks, &max_entries))
    return NULL;
  orSetStackCollector(python_stack);
  CHECK(orRecordMemoryHistory(enabled, trace, stacks, (size_t)max_entries));
  Py_RETURN_NONE;
}

static PyObject* memory_snapshot(PyObject* self, PyObject* unused) {
  const char* json = NULL;
  CHECK(orMemorySnapshot(&json));
  return PyUnicode_FromString(json);
}

/* _host_memory_stats(): {name: [current, peak, allocated, freed] or count}. */
static PyObject* host_memory_stats(PyObject* self, PyObject* unused) {
  orHostMemoryStats s;
  CHECK(orGetHostMemoryStats(&s));
  return Py_BuildValue(
      "{s:[LLLL],s:[LLLL],s:L,s:L}", "allocations", (long long)s.allocations[0], (long long)s.allocations[1],
      (long long)s.allocations[2], (long long)s.allocations[3], "allocated_bytes", (long long)s.allocated_bytes[0],
      (long long)s.allocated_bytes[1], (long long)s.allocated_bytes[2], (long long)s.allocated_bytes[3],
      "num_host_alloc", (long long)s.num_host_alloc, "num_host_free", (long long)s.num_host_free);
}

/* _reset_host_memory_stats(peak, accumulated) */
static PyObject* reset_host_memory_stats(PyObject* self, PyObject* args) {
  int peak, accumulated;
  if (!PyArg_ParseTuple(args, "pp", &peak, &accumulated))
    return NULL;
  CHECK(orResetHostMemoryStats(peak, accumulated));
  Py_RETURN_NONE;
}

static PyObject* set_op_timeout_ms(PyObject* self, PyObject* arg) {
  unsigned long long ms = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred())
    return NULL;
  orSetOpTimeoutMs((uint64_t)ms);
  Py_RETURN_NONE;
}

static PyObject* get_op_timeout_ms(PyObject* self, PyObject* unused) {
  return PyLong_FromUnsignedLongLong((unsigned long long)orGetOpTimeoutMs());
}

/* _inject_fault(kind, after) */
static PyObject* inject_fault(PyObject* self, PyObject* args) {
  const char* kind;
  unsigned long long after;
  if (!PyArg_ParseTuple(args, "sK", &kind, &after))
    return NULL;
  CHECK(orInjectFault(kind, (uint64_t)after));
  Py_RETURN_NONE;
}

/* _finalize(): release the runtime now (orFinalize), without the GIL: the
 * streams drain first, and a kernel's captures may need it. */
static PyObject* finalize(PyObject* self, PyObject* unused) {
  int code;
  Py_BEGIN_ALLOW_THREADS
  code = orFinalize();
  Py_END_ALLOW_THREADS
  CHECK(code);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"_device_count", device_count, METH_NOARGS, "Number of openreg devices (never initializes)."},
    {"_get_device", get_device, METH_NOARGS, "This thread's current openreg device."},
    {"_set_device", set_device, METH_O, "Set this thread's current openreg device."},
    {"_exchange_device", exchange_device, METH_O, "Set the current device; return the previous one."},
    {"_init", init, METH_NOARGS, "Initialize the openreg runtime."},
    {"_synchronize", synchronize, METH_O, "Wait for every stream of a device."},
    {"_get_device_properties", device_properties, METH_O, "A device's properties, as a dict."},
    {"_set_memory_fraction", set_memory_fraction, METH_VARARGS, "(device, fraction): cap reservations."},
    {"_is_initialized", is_initialized, METH_NOARGS, "Whether the runtime is initialized."},
    {"_is_in_bad_fork", is_in_bad_fork, METH_NOARGS, "Whether this is a fork child of an initialized process."},
    {"_has_primary_context", has_primary_context, METH_O, "Whether a device's context exists."},
    {"_live_worker_count", live_worker_count, METH_O, "Stream worker threads alive on a device."},
    {"_stream_priority_range", stream_priority_range, METH_NOARGS, "(least, greatest) stream priority."},
    {"_options", options, METH_NOARGS, "The OPENREG_* options in force, as text lines."},
    {"_recorded_kernel_dtypes", recorded_kernel_dtypes, METH_NOARGS, "OPENREG_DTYPES=record: calls since the last read."},
    {"_sleep", sleep_kernel, METH_O, "Queue a kernel that sleeps for the given milliseconds."},
    {"_stop_device", stop_device, METH_O, "Stop a device: abandon its queued work, reject new work."},
    {"_restart_device", restart_device, METH_O, "Bring a stopped device back (a new memory generation)."},
    {"_is_device_stopped", is_device_stopped, METH_O, "Whether a device is stopped."},
    {"_prepare_exit", prepare_exit, METH_NOARGS, "At exit: drain the streams before the interpreter finalizes."},
    {"_get_default_generator", openreg_get_default_generator, METH_O, "The default torch.Generator of a device."},
    {"_utilization", utilization, METH_O, "Percent of the last second a device's streams had work."},
    {"_can_device_access_peer", can_access_peer, METH_VARARGS, "(device, peer): peer access."},
    {"_graph_pool_handle", graph_pool_handle, METH_NOARGS, "A fresh graph memory pool id."},
    {"_is_current_stream_capturing", is_current_stream_capturing, METH_O, "Whether a device's current stream captures."},
    {"_get_memory_fraction", get_memory_fraction, METH_O, "A device's per-process memory fraction."},
    {"_set_sync_debug_mode", set_sync_debug_mode, METH_O, "0 default, 1 warn, 2 error."},
    {"_sanitizer_set_mode", sanitizer_set_mode, METH_O, "0 off, 1 raise, 2 warn."},
    {"_sanitizer_mode", sanitizer_mode, METH_NOARGS, "0 off, 1 raise, 2 warn."},
    {"_sanitizer_counts", sanitizer_counts, METH_NOARGS, "Reports so far, by kind."},
    {"_sanitizer_reports", sanitizer_reports, METH_NOARGS, "The reports' texts."},
    {"_sanitizer_clear", sanitizer_clear, METH_NOARGS, "Drops reports and counts."},
    {"_sanitizer_set_library_roots", sanitizer_set_library_roots, METH_O, "Library directories for source lines."},
    {"_get_sync_debug_mode", get_sync_debug_mode, METH_NOARGS, "0 default, 1 warn, 2 error."},
    {"_malloc", device_malloc, METH_O, "Device memory for the current stream."},
    {"_free", device_free, METH_O, "Free device memory from _malloc."},
    {"_stream_of_handle", stream_of_handle, METH_O, "(device, id) of a native stream handle."},
    {"_record_memory_history", record_memory_history, METH_VARARGS, "(enabled, trace, stacks, max_entries)."},
    {"_memory_snapshot", memory_snapshot, METH_NOARGS, "Allocator state and events, as JSON."},
    {"_finalize", finalize, METH_NOARGS, "Release the runtime now."},
    {"_inject_fault", inject_fault, METH_VARARGS, "(kind, after): arm an injected fault."},
    {"_set_op_timeout_ms", set_op_timeout_ms, METH_O, "Synchronize gives up on kernels longer than this (0: never)."},
    {"_get_op_timeout_ms", get_op_timeout_ms, METH_NOARGS, "The op timeout in ms (0: none)."},
    {"_host_memory_stats", host_memory_stats, METH_NOARGS, "Pinned host allocator statistics."},
    {"_reset_host_memory_stats", reset_host_memory_stats, METH_VARARGS, "(peak, accumulated)."},
    {"_ipc_mem_handle", openreg_ipc_mem_handle, METH_O, "(fd, mapping_size, offset) of device memory, to share it."},
    {"_ipc_open_storage", openreg_ipc_open_storage, METH_VARARGS, "A storage over another process's device memory."},
    {"_ipc_signal_when_reached", openreg_ipc_signal_when_reached, METH_VARARGS, "Signal a pipe from the current stream."},
    {"_ipc_wait_for_signal", openreg_ipc_wait_for_signal, METH_VARARGS, "The current stream waits for a pipe signal."},
    {"_ipc_event_open", openreg_ipc_event_open, METH_O, "An interprocess event over a shared page (a memory file)."},
    {"_ipc_event_record", openreg_ipc_event_record, METH_VARARGS, "(event, device): record on the current stream."},
    {"_ipc_event_wait", openreg_ipc_event_wait, METH_VARARGS, "(event, device): the current stream waits for it."},
    {"_ipc_event_query", openreg_ipc_event_query, METH_O, "Whether an interprocess event's last record completed."},
    {"_ipc_event_synchronize", openreg_ipc_event_synchronize, METH_O, "The host waits for an interprocess event."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torch_openreg._C", NULL, -1, methods};

// The runtime reads its options on first use and warns about invalid ones
// through TORCH_WARN. Reading them here, at import, turns those warnings into
// Python UserWarnings (so -W error and warnings.catch_warnings see them)
// instead of lines printed by c10's default handler.
static bool read_options_with_python_warnings() {
  CollectWarnings collected;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&collected);
    orGetOptions();
  }
  return warn_in_python(collected);
}

PyMODINIT_FUNC PyInit__C(void) {
  if (!read_options_with_python_warnings())
    return NULL;
  openreg_register_fork_handler();
  return PyModule_Create(&module);
}
