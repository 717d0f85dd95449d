/*
 * torch_openreg._C: the Python bindings the torch_openreg package uses.
 * Plain CPython over the C ABI of include/openreg.h; every failure becomes a
 * RuntimeError carrying the runtime's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include "openreg.h"

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
  int device = (int)PyLong_AsLong(arg);
  if (PyErr_Occurred())
    return NULL;
  CHECK(orSetDevice(device));
  Py_RETURN_NONE;
}

static PyObject* exchange_device(PyObject* self, PyObject* arg) {
  int device = (int)PyLong_AsLong(arg), previous = 0;
  if (PyErr_Occurred())
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
  int device = (int)PyLong_AsLong(arg), has = 0;
  if (PyErr_Occurred())
    return NULL;
  CHECK(orDeviceHasPrimaryContext(device, &has));
  return PyBool_FromLong(has);
}

static PyObject* live_worker_count(PyObject* self, PyObject* arg) {
  int device = (int)PyLong_AsLong(arg), count = 0;
  if (PyErr_Occurred())
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
  CHECK(orLaunchHostFunc(stream, sleep_on_stream, (void*)(intptr_t)(ms * 1e6)));
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"_device_count", device_count, METH_NOARGS, "Number of openreg devices (never initializes)."},
    {"_get_device", get_device, METH_NOARGS, "This thread's current openreg device."},
    {"_set_device", set_device, METH_O, "Set this thread's current openreg device."},
    {"_exchange_device", exchange_device, METH_O, "Set the current device; return the previous one."},
    {"_init", init, METH_NOARGS, "Initialize the openreg runtime."},
    {"_is_initialized", is_initialized, METH_NOARGS, "Whether the runtime is initialized."},
    {"_is_in_bad_fork", is_in_bad_fork, METH_NOARGS, "Whether this is a fork child of an initialized process."},
    {"_has_primary_context", has_primary_context, METH_O, "Whether a device's context exists."},
    {"_live_worker_count", live_worker_count, METH_O, "Stream worker threads alive on a device."},
    {"_stream_priority_range", stream_priority_range, METH_NOARGS, "(least, greatest) stream priority."},
    {"_options", options, METH_NOARGS, "The OPENREG_* options in force, as text lines."},
    {"_sleep", sleep_kernel, METH_O, "Queue a kernel that sleeps for the given milliseconds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torch_openreg._C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) {
  return PyModule_Create(&module);
}
