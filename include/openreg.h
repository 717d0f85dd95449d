/*
 * openreg.h — the plain C ABI of the openreg runtime (no PyTorch needed),
 * in the spirit of a CUDA runtime header. Implemented in src/bridge/capi.rs and
 * exported by libtorch_openreg.so.
 *
 * Every call returns an orError_t; on failure, orGetLastErrorMessage()
 * returns this thread's detailed message (naming the device, stream or
 * event at fault). Handles are owned by the runtime: streams live for the
 * whole process; events live until orEventDestroy. Handles are checked: a
 * null, garbage or destroyed handle (a second orEventDestroy, a use after
 * destroy) returns orErrorInvalidHandle and changes nothing. An event
 * handle is an opaque value, not a pointer.
 */
#ifndef OPENREG_H
#define OPENREG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum orError {
  orSuccess = 0,
  orErrorInvalidDevice = 1,
  orErrorInvalidValue = 2,
  orErrorInvalidHandle = 3,
  orErrorNotReady = 4,
  orErrorBadFork = 5,
  orErrorNoDevice = 6,
  orErrorMemoryAllocation = 7,
  /* Not permitted while a stream captures a graph, or the capture failed. */
  orErrorStreamCapture = 8,
  /* The device is stopped (orDeviceStop) and accepts no new work. */
  orErrorDeviceStopped = 9,
} orError_t;

typedef struct orStream_st* orStream_t;
typedef struct orEvent_st* orEvent_t;
typedef void (*orHostFn_t)(void* user_data);

/* What orGetDeviceProperties reports (cf. cudaDeviceProp). */
typedef struct orDeviceProp {
  char name[64];
  int major;
  int minor;
  int multiProcessorCount;
  size_t totalGlobalMem;
  unsigned char uuid[16]; /* stable per device index */
} orDeviceProp;

/* orEventCreate flags. */
#define orEventDefault 0x0u
#define orEventDisableTiming 0x2u

const char* orGetErrorString(int error);
const char* orGetLastErrorMessage(void);

/* Runtime and devices. The current device is per thread (starts at 0). */
int orInit(void);
int orIsInitialized(void);
int orIsInBadFork(void);
int orGetDeviceCount(int* count);
int orGetDevice(int* device);
int orSetDevice(int device);
int orDeviceSynchronize(void);
int orDeviceHasPrimaryContext(int device, int* has_context);
int orDeviceGetLiveWorkerCount(int device, int* count);
int orDeviceGetStreamPriorityRange(int* least, int* greatest);
int orGetDeviceProperties(orDeviceProp* prop, int device);

/* Device memory, from the caching allocator of the current device (reuse is
 * ordered on the current stream, as for PyTorch tensors). */
int orMalloc(void** ptr, size_t size);
int orFree(void* ptr);
int orMemGetInfo(size_t* free, size_t* total);
int orSetMemoryFraction(int device, double fraction);

/* Device memory shared between processes (as cudaIpc*Handle). Each device
 * allocation lies in a mapping of a memory file: orIpcGetMemHandle gives
 * that file's descriptor (owned by the runtime, valid while the allocation
 * lives), the mapping's size and ptr's offset in it. Another process that
 * received the descriptor (SCM_RIGHTS, or torch.multiprocessing) maps the
 * same memory with orIpcOpenMemHandle and releases it with
 * orIpcCloseMemHandle. */
int orIpcGetMemHandle(int* fd, size_t* mapping_size, size_t* offset, void* ptr);
int orIpcOpenMemHandle(void** base, int fd, size_t mapping_size);
int orIpcCloseMemHandle(void* base);

/* Streams. device -1 means the current device. */
int orStreamGetCurrent(int device, orStream_t* stream);
int orStreamGetDefault(int device, orStream_t* stream);
int orStreamGetFromPool(int device, int priority, orStream_t* stream);
int orStreamGetId(orStream_t stream, int* device, int64_t* id);
int orStreamGetPriority(orStream_t stream, int* priority);
int orStreamQuery(orStream_t stream); /* orSuccess or orErrorNotReady */
int orStreamSynchronize(orStream_t stream);
/* Work queued on `stream` later waits until the event's recorded point has
 * completed. The stream may belong to another device than the event (as
 * with cudaStreamWaitEvent); a never-recorded event makes it wait for nothing. */
int orStreamWaitEvent(orStream_t stream, orEvent_t event);
int orLaunchHostFunc(orStream_t stream, orHostFn_t fn, void* user_data);
/* orLaunchHostFunc, naming the function in errors about it (an op timeout
 * names the kernel that ran too long). `name` must live for the process (a
 * string literal); NULL names it "host function". */
int orLaunchHostFuncNamed(orStream_t stream, orHostFn_t fn, void* user_data, const char* name);
/* orLaunchHostFunc whose user data the runtime owns from the call on:
 * release(user_data) is called once `fn` will not run again: after its run,
 * when the graph that captured it is destroyed (a captured host function
 * runs once per launch), or before the call returns if the launch fails. */
int orLaunchHostFuncOwned(orStream_t stream, orHostFn_t fn, void* user_data, orHostFn_t release);
/* One range of memory a kernel reads (written == 0) or writes. */
typedef struct orMemAccess {
  const void* ptr;
  size_t bytes;
  int written;
} orMemAccess;
/* orLaunchHostFuncOwned for a kernel: named as orLaunchHostFuncNamed names
 * it, and declaring the `count` ranges at `accesses` it reads and writes,
 * which the stream sanitizer checks (OPENREG_SANITIZER; a launch that
 * declares nothing is not checked). In the sanitizer's "raise" mode a
 * launch that makes a stream-ordering bug fails with its report. */
int orLaunchKernel(
    orStream_t stream,
    orHostFn_t fn,
    void* user_data,
    orHostFn_t release,
    const char* name,
    const orMemAccess* accesses,
    size_t count);

/* Exit of a host that must not be re-entered from stream workers once it
 * finalizes (CPython: a worker that takes the GIL then is ended, and the
 * process aborts). The host calls orPrepareHostExit before it finalizes
 * (torch_openreg does, from a Python atexit handler, without the GIL): it
 * waits for every stream's queued work, then waits for the releases in
 * flight and makes every later orKernelReleaseBegin return 0. A host
 * function that owns what it captured (torch_openreg::launch does) brackets
 * destroying it with orKernelReleaseBegin() == 1 ... orKernelReleaseEnd(),
 * and leaks it on 0. Initializes nothing; idempotent. */
int orPrepareHostExit(void);
int orKernelReleaseBegin(void);
void orKernelReleaseEnd(void);

/* Events, created on the current device; recorded only on streams of that
 * device (orErrorInvalidValue otherwise, as cudaEventRecord), waited on by
 * streams of any device (orStreamWaitEvent). */
int orEventCreate(orEvent_t* event, unsigned int flags);
int orEventRecord(orEvent_t event, orStream_t stream);
int orEventQuery(orEvent_t event); /* orSuccess or orErrorNotReady */
int orEventSynchronize(orEvent_t event);
int orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end);
int orEventDestroy(orEvent_t event);

/* The options in force, one per line: NAME<TAB>value<TAB>source<TAB>meaning,
 * where source is "environment", "default" or "invalid" (a value that cannot
 * be used, shown as set; orInit then fails with orErrorInvalidValue, and
 * orGetLastErrorMessage names each such variable). */
const char* orGetOptions(void);

/* Releases the runtime now (drains and stops the streams, returns cached
 * memory, in priority order) for embedders that tear down before process
 * exit; later device work fails. Idempotent. At process exit the runtime
 * does this itself, waiting at most OPENREG_EXIT_DRAIN_MS for queued work. */
int orFinalize(void);

/* Stopping and restarting a device, to test a program's handling of a
 * device that goes away. orDeviceStop abandons the work queued on the
 * device's streams that has not started (each stream's next synchronize
 * reports it; a kernel already running finishes) and makes new work for the
 * device fail with orErrorDeviceStopped (launches, allocations, event
 * records; waits, queries and frees still work). orDeviceRestart makes it
 * accept work again; memory allocated on it before the restart stays mapped
 * until freed but cannot be used by kernels (orErrorInvalidValue, naming
 * it). Stopping a stopped device or restarting a running one is
 * orErrorInvalidValue. */
int orDeviceStop(int device);
int orDeviceRestart(int device);
int orDeviceIsStopped(int device, int* stopped);

/* Diagnostics. */
/* Percent (0..100) of the last second during which a stream of `device` had work. */
int orDeviceGetUtilization(int device, int* percent);
int orDeviceCanAccessPeer(int* can_access, int device, int peer);
int orGetMemoryFraction(int device, double* fraction);
/* Sync-debug mode: 0 default, 1 warn, 2 error on host-blocking operations. */
int orSetSyncDebugMode(int mode);
int orGetSyncDebugMode(void);

/* The stream sanitizer (OPENREG_SANITIZER; docs/sanitizer-and-diagnostics.md): mode
 * 0 off, 1 raise (the offending launch fails with the report), 2 warn
 * (reports are kept and printed at exit). Counts are per kind, in the order
 * orSanitizerGetKindName(0..) names them ("race", "write_after_read",
 * "freed_in_use", "pinned_host_access", "query_misuse"); a report's text is
 * valid until this thread's next orSanitizerGetReport. The source
 * collector returns "file:line" of the calling host code, or NULL. */
int orSanitizerSetMode(int mode);
int orSanitizerGetMode(void);
int orSanitizerGetCounts(uint64_t* counts, size_t len);
const char* orSanitizerGetKindName(size_t kind);
size_t orSanitizerGetReportCount(void);
int orSanitizerGetReport(size_t index, const char** text);
void orSanitizerClear(void);
void orSanitizerSetSourceCollector(const char* (*collector)(void));

/* Fault injection: `kind` "alloc", "kernel", "event" or "enumerate"; `after`
 * more operations of that kind succeed, the next one fails once with an
 * error saying it was injected (a kernel's failure is reported by the next
 * synchronize of its stream). The option OPENREG_FAULT=kind[:after] arms
 * the same from the start of the process. */
int orInjectFault(const char* kind, uint64_t after);

/* Op timeout: a synchronizing call gives up on a kernel that has run longer
 * than `ms` milliseconds (0: never) with orErrorNotReady and a message naming
 * the kernel and the stream; the kernel keeps running. */
void orSetOpTimeoutMs(uint64_t ms);
uint64_t orGetOpTimeoutMs(void);

/* Pinned host memory statistics: each is {current, peak, allocated, freed}. */
typedef struct orHostMemoryStats {
  int64_t allocations[4];
  int64_t allocated_bytes[4];
  int64_t num_host_alloc;
  int64_t num_host_free;
} orHostMemoryStats;
int orGetHostMemoryStats(orHostMemoryStats* stats);
int orResetHostMemoryStats(int peak, int accumulated);

/* Memory history. `enabled` 0 stops recording and drops the events; `trace`
 * 1 keeps the event trace; `stacks` 0 none, 1 for allocations, 2 for
 * allocations and frees, collected by the installed stack collector, which
 * returns the calling thread's stack as text (one frame per line,
 * "file<TAB>line<TAB>function", innermost first) valid until its next call
 * on that thread, or NULL. orMemorySnapshot returns every device's segments,
 * blocks and events as JSON, valid until this thread's next call. */
typedef const char* (*orStackCollector_t)(void);
int orRecordMemoryHistory(int enabled, int trace, int stacks, size_t max_entries);
void orSetStackCollector(orStackCollector_t collector);
int orMemorySnapshot(const char** json);

/* Graph capture, in the spirit of cudaStreamBeginCapture/cudaGraphLaunch.
 * Between orStreamBeginCapture and orStreamEndCapture the work queued on
 * the stream (kernels, host functions, event records; streams that wait on
 * an event recorded in the capture join it) is recorded, not run; device
 * memory allocated for it comes from the graph's private pool. A host
 * function recorded in a graph runs once per launch. A host wait for the
 * capturing stream fails with orErrorStreamCapture; so, under
 * orStreamCaptureModeGlobal, does any host synchronization from any
 * thread, under ThreadLocal from the capturing thread (Relaxed allows
 * them). orStreamEndCapture fails (and the capture is discarded) if an
 * illegal call invalidated it or a joined stream was not joined back.
 * A launch runs the recorded work, in recorded order, as one piece of work
 * of `stream`, on whatever the captured buffers hold then; launches of one
 * executable graph are ordered among themselves. An executable graph keeps
 * its graph's pool alive; the pool goes with the last handle. */
typedef struct orGraph_st* orGraph_t;
typedef struct orGraphExec_st* orGraphExec_t;
typedef enum orStreamCaptureMode {
  orStreamCaptureModeGlobal = 0,
  orStreamCaptureModeThreadLocal = 1,
  orStreamCaptureModeRelaxed = 2,
} orStreamCaptureMode;
int orStreamBeginCapture(orStream_t stream, orStreamCaptureMode mode);
int orStreamEndCapture(orStream_t stream, orGraph_t* graph);
int orStreamIsCapturing(orStream_t stream, int* capturing);
int orGraphGetNodeCount(orGraph_t graph, size_t* count);
int orGraphInstantiate(orGraphExec_t* exec, orGraph_t graph);
int orGraphLaunch(orGraphExec_t exec, orStream_t stream);
int orGraphExecDestroy(orGraphExec_t exec);
int orGraphDestroy(orGraph_t graph);
/* A fresh memory pool id (torch.openreg.graph_pool_handle). */
int orGraphPoolHandle(uint64_t* first, uint64_t* second);

#ifdef __cplusplus
}
#endif

#endif /* OPENREG_H */
