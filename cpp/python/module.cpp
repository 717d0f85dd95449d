// torch_openreg._C: the Python bindings the torch_openreg package uses.
// CPython over the C ABI of include/openreg.h (generators through ATen:
// generator.cpp); every failure becomes a RuntimeError carrying the
// runtime's message.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <climits>
#include <ctime>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "openreg.h"

// In generator.cpp (which needs torch's Python headers).
extern "C" PyObject* openreg_get_default_generator(PyObject* self, PyObject* arg);
extern "C" void openreg_register_fork_handler();
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

static PyObject* raise_error(int code) {
  const char* detail = orGetLastErrorMessage();
  PyErr_SetString(PyExc_RuntimeError, detail && detail[0] ? detail : orGetErrorString(code));
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

// synchronize(device): waits for every stream of `device`, without the GIL.
static PyObject* synchronize(PyObject* self, PyObject* arg) {
  int device = 0, previous = 0;
  if (!parse_device(arg, &device))
    return NULL;
  CHECK(orGetDevice(&previous));
  CHECK(orSetDevice(device));
  int code;
  Py_BEGIN_ALLOW_THREADS
  code = orDeviceSynchronize();
  Py_END_ALLOW_THREADS
  orSetDevice(previous);
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
      "{s:s,s:i,s:i,s:i,s:K}", "name", prop.name, "major", prop.major, "minor", prop.minor,
      "multi_processor_count", prop.multiProcessorCount, "total_memory", (unsigned long long)prop.totalGlobalMem);
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

static PyObject* options(PyObject* self, PyObject* unused) {
  return PyUnicode_FromString(orGetOptions());
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
  code = orLaunchHostFunc(stream, sleep_on_stream, (void*)(intptr_t)(ms * 1e6));
  Py_END_ALLOW_THREADS
  CHECK(code);
  Py_RETURN_NONE;
}

/* _prepare_exit(): registered with atexit when the package is imported, so
 * CPython runs it before it finalizes: drains every stream and stops kernels
 * from releasing captures after that (Note [Host exit] in src/lifecycle.rs).
 * Without the GIL: a kernel's captures may need it to be released. */
static PyObject* prepare_exit(PyObject* self, PyObject* unused) {
  int code;
  Py_BEGIN_ALLOW_THREADS
  code = orPrepareHostExit();
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
    {"_sleep", sleep_kernel, METH_O, "Queue a kernel that sleeps for the given milliseconds."},
    {"_prepare_exit", prepare_exit, METH_NOARGS, "At exit: drain the streams before the interpreter finalizes."},
    {"_get_default_generator", openreg_get_default_generator, METH_O, "The default torch.Generator of a device."},
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

// Collects c10 warnings (TORCH_WARN) instead of printing them.
struct CollectWarnings final : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
};

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
  for (const std::string& message : collected.messages) {
    if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0)
      return false;
  }
  return true;
}

PyMODINIT_FUNC PyInit__C(void) {
  if (!read_options_with_python_warnings())
    return NULL;
  openreg_register_fork_handler();
  return PyModule_Create(&module);
}
