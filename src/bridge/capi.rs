//! The plain C ABI declared in `include/openreg.h`, in the style of a CUDA
//! runtime header: every call returns an `orError_t`; the detailed message of
//! this thread's last failure is kept for `orGetLastErrorMessage`.
//!
//! Nothing may unwind across `extern "C"`: every entry point runs inside
//! `guarded`, which turns errors and panics into codes.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use once_cell::sync::Lazy;

use crate::runtime::device;
use crate::base::error::{Error, ErrorKind, Result};
use crate::runtime::event::{handle, Event};
use crate::base::options;
use crate::runtime::stream::{self, StreamQueue, Task, TaskName, HIGHEST_PRIORITY, LOWEST_PRIORITY};

pub type OrError = c_int;
pub const OR_SUCCESS: OrError = 0;
/// `orEventCreate` flag: no timing (cheaper, like `cudaEventDisableTiming`).
pub const OR_EVENT_DISABLE_TIMING: c_uint = 0x2;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn guarded(f: impl FnOnce() -> Result<()>) -> OrError {
    let err = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return OR_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => Error::invalid_value("internal error: a runtime call panicked"),
    };
    let code = err.kind as OrError;
    let message = CString::new(err.message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|m| *m.borrow_mut() = message);
    code
}

/// Writes `value` through an out-pointer, rejecting null.
fn put<T>(out: *mut T, value: T) -> Result<()> {
    // SAFETY: non-null out-pointers are the caller's writable storage.
    match unsafe { out.as_mut() } {
        Some(slot) => {
            *slot = value;
            Ok(())
        }
        None => Err(Error::invalid_value("a required output pointer is null")),
    }
}

fn stream_arg(s: *const c_void) -> Result<&'static StreamQueue> {
    // SAFETY: handles come from orStreamGet*; see `StreamQueue::from_handle`.
    unsafe { StreamQueue::from_handle(s.cast()) }
}

/// The event behind a handle from `orEventCreate`; a destroyed, garbage or
/// null handle is `orErrorInvalidHandle` (Note [Event handles]).
fn event_arg(e: *const c_void) -> Result<Arc<Event>> {
    handle::get(e as usize)
}

fn stream_handle(s: &'static StreamQueue) -> *mut c_void {
    s as *const StreamQueue as *mut c_void
}

#[no_mangle]
pub extern "C" fn orGetErrorString(error: OrError) -> *const c_char {
    let text: &'static CStr = match error {
        0 => c"no error",
        1 => c"invalid device index",
        2 => c"invalid value",
        3 => c"invalid stream or event handle",
        4 => c"not ready",
        5 => c"used in a forked child of an initialized process",
        6 => c"no openreg device is available",
        7 => c"out of device memory",
        8 => c"operation not permitted during graph capture (or the capture failed)",
        9 => c"the device is stopped (orDeviceStop); orDeviceRestart brings it back",
        _ => c"unknown error code",
    };
    text.as_ptr()
}

/// The detailed message of this thread's last failed call ("" if none).
#[no_mangle]
pub extern "C" fn orGetLastErrorMessage() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr())
}

#[no_mangle]
pub extern "C" fn orGetDeviceCount(count: *mut c_int) -> OrError {
    let enumeration_fails = crate::diagnostics::fault::strikes(crate::diagnostics::fault::Fault::Enumerate);
    guarded(|| {
        put(
            count,
            if enumeration_fails {
                0
            } else {
                device::device_count() as c_int
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn orGetDevice(device: *mut c_int) -> OrError {
    guarded(|| put(device, device::current_device() as c_int))
}

#[no_mangle]
pub extern "C" fn orSetDevice(device: c_int) -> OrError {
    guarded(|| device::set_device(device.into()))
}

#[no_mangle]
pub extern "C" fn orDeviceSynchronize() -> OrError {
    guarded(|| {
        let what = "device synchronize (orDeviceSynchronize)";
        crate::runtime::graph::check_host_sync(what, None)?;
        crate::diagnostics::sync_debug::check(what)?;
        device::synchronize_device(device::current_device().into())
    })
}

#[no_mangle]
pub extern "C" fn orInit() -> OrError {
    guarded(device::init)
}

#[no_mangle]
pub extern "C" fn orIsInitialized() -> c_int {
    device::is_initialized() as c_int
}

#[no_mangle]
pub extern "C" fn orIsInBadFork() -> c_int {
    device::is_in_bad_fork() as c_int
}

#[no_mangle]
pub extern "C" fn orDeviceHasPrimaryContext(device: c_int, has: *mut c_int) -> OrError {
    guarded(|| put(has, device::has_primary_context(device.into())? as c_int))
}

/// How many of `device`'s streams currently have a worker thread.
#[no_mangle]
pub extern "C" fn orDeviceGetLiveWorkerCount(device: c_int, count: *mut c_int) -> OrError {
    guarded(|| {
        let live = match device::has_primary_context(device.into())? {
            true => device::context(device.into())?.streams.live_workers(),
            false => 0,
        };
        put(count, live as c_int)
    })
}

/// `orDeviceProp` of include/openreg.h.
#[repr(C)]
pub struct DeviceProp {
    pub name: [c_char; 64],
    pub major: c_int,
    pub minor: c_int,
    pub multi_processor_count: c_int,
    pub total_global_mem: usize,
    pub uuid: [u8; 16],
}

#[no_mangle]
pub extern "C" fn orGetDeviceProperties(prop: *mut DeviceProp, device: c_int) -> OrError {
    guarded(|| {
        let p = device::properties(device.into())?;
        let mut name = [0 as c_char; 64];
        for (slot, byte) in name.iter_mut().zip(p.name.bytes().take(63)) {
            *slot = byte as c_char;
        }
        put(
            prop,
            DeviceProp {
                name,
                major: p.major,
                minor: p.minor,
                multi_processor_count: p.multi_processor_count,
                total_global_mem: p.total_memory,
                uuid: p.uuid,
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn orDeviceGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> OrError {
    guarded(|| {
        put(least, LOWEST_PRIORITY)?;
        put(greatest, HIGHEST_PRIORITY)
    })
}

/// This thread's current stream of `device` (-1: the current device).
#[no_mangle]
pub extern "C" fn orStreamGetCurrent(device: c_int, stream: *mut *mut c_void) -> OrError {
    guarded(|| put(stream, stream_handle(stream::current(device.into())?)))
}

#[no_mangle]
pub extern "C" fn orStreamGetDefault(device: c_int, stream: *mut *mut c_void) -> OrError {
    guarded(|| {
        put(
            stream,
            stream_handle(stream::lookup(device.into(), stream::DEFAULT_STREAM_ID)?),
        )
    })
}

#[no_mangle]
pub extern "C" fn orStreamGetFromPool(
    device: c_int,
    priority: c_int,
    stream: *mut *mut c_void,
) -> OrError {
    guarded(|| {
        let ctx = device::context(device::resolve(device.into()))?;
        put(stream, stream_handle(ctx.streams.from_pool(priority)))
    })
}

#[no_mangle]
pub extern "C" fn orStreamGetId(
    stream: *const c_void,
    device: *mut c_int,
    id: *mut i64,
) -> OrError {
    guarded(|| {
        let s = stream_arg(stream)?;
        put(device, s.device() as c_int)?;
        put(id, s.id())
    })
}

#[no_mangle]
pub extern "C" fn orStreamGetPriority(stream: *const c_void, priority: *mut c_int) -> OrError {
    guarded(|| put(priority, stream_arg(stream)?.priority()))
}

/// `orSuccess` if all work on the stream has finished, else `orErrorNotReady`.
#[no_mangle]
pub extern "C" fn orStreamQuery(stream: *const c_void) -> OrError {
    guarded(|| {
        match stream_arg(stream)
            .and_then(|s| crate::runtime::graph::check_not_capturing(s, "orStreamQuery").map(|_| s))?
            .host_query()?
        {
            true => Ok(()),
            false => Err(Error::new(
                ErrorKind::NotReady,
                "the stream has unfinished work",
            )),
        }
    })
}

#[no_mangle]
pub extern "C" fn orStreamSynchronize(stream: *const c_void) -> OrError {
    guarded(|| {
        let stream = stream_arg(stream)?;
        let what = format!("Stream.synchronize() of {stream}");
        crate::runtime::graph::check_host_sync(&what, Some(stream))?;
        crate::diagnostics::sync_debug::check(&what)?;
        stream.host_synchronize()
    })
}

/// A host callback queued on a stream, like `cudaLaunchHostFunc`.
pub type HostFn = extern "C" fn(user_data: *mut c_void);

#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: the pointer is the caller's opaque user data, handed back to the
// caller's own function; like cudaLaunchHostFunc, the caller is responsible
// for it being usable from the stream's worker thread.
unsafe impl Send for SendPtr {}

/// Runs `func(user_data)` on the stream's worker, in stream order (once per
/// replay when the stream is capturing a graph).
#[no_mangle]
pub extern "C" fn orLaunchHostFunc(
    stream: *const c_void,
    func: Option<HostFn>,
    user_data: *mut c_void,
) -> OrError {
    guarded(|| launch_host_func(stream, func, user_data, HOST_FUNCTION, "orLaunchHostFunc"))
}

/// `orLaunchHostFunc`, naming the function for errors about it (an op
/// timeout: Note [Task names]). `name` must live for the process (a
/// literal); null names it "host function".
#[no_mangle]
pub extern "C" fn orLaunchHostFuncNamed(
    stream: *const c_void,
    func: Option<HostFn>,
    user_data: *mut c_void,
    name: *const c_char,
) -> OrError {
    guarded(|| {
        launch_host_func(
            stream,
            func,
            user_data,
            host_function_name(name),
            "orLaunchHostFuncNamed",
        )
    })
}

/// What a host function launched without a name is called.
const HOST_FUNCTION: TaskName = TaskName::kernel(c"host function");

/// A host function's name from the C ABI: `name`, or "host function" for null.
fn host_function_name(name: *const c_char) -> TaskName {
    match name.is_null() {
        true => HOST_FUNCTION,
        // SAFETY: the C contract: a non-null name lives for the process.
        false => unsafe { TaskName::kernel_from_ptr(name) },
    }
}

fn launch_host_func(
    stream: *const c_void,
    func: Option<HostFn>,
    user_data: *mut c_void,
    name: TaskName,
    call: &str,
) -> Result<()> {
    let s = stream_arg(stream)?;
    let func =
        func.ok_or_else(|| Error::invalid_value(format!("{call}: the host function is null")))?;
    let data = SendPtr(user_data);
    let work: crate::runtime::graph::Work = Box::new(move || {
        let data = data;
        func(data.0);
        Ok(())
    });
    let task = Task::Run(crate::runtime::profiler::timed(name.text().into_owned(), s, work));
    s.submit_named(task, name, || name.text().into_owned())
        .map(drop)
}

/// Releases a host function's user data: called once, when the runtime is
/// done with the function.
pub type ReleaseFn = extern "C" fn(user_data: *mut c_void);

/// User data that the runtime owns: released when dropped.
struct OwnedUserData {
    data: SendPtr,
    release: ReleaseFn,
}

impl Drop for OwnedUserData {
    fn drop(&mut self) {
        (self.release)(self.data.0);
    }
}

/// `orLaunchHostFunc` whose user data the runtime owns from the call on:
/// `release(user_data)` runs once the function will not run again — after
/// its run, or when the graph that captured it is destroyed (it then runs
/// once per launch), or at once if the launch fails.
#[no_mangle]
pub extern "C" fn orLaunchHostFuncOwned(
    stream: *const c_void,
    func: Option<HostFn>,
    user_data: *mut c_void,
    release: Option<ReleaseFn>,
) -> OrError {
    let Some(release) = release else {
        return guarded(|| {
            Err(Error::invalid_value(
                "orLaunchHostFuncOwned: the release function is null",
            ))
        });
    };
    let owned = OwnedUserData {
        data: SendPtr(user_data),
        release,
    };
    guarded(move || {
        launch_owned(
            stream,
            func,
            owned,
            HOST_FUNCTION,
            &[],
            "orLaunchHostFuncOwned",
        )
    })
}

/// One range of memory a kernel reads or writes (`orMemAccess`).
#[repr(C)]
pub struct MemAccess {
    pub ptr: *const c_void,
    pub bytes: usize,
    pub written: c_int,
}

/// `orLaunchHostFuncOwned` for a kernel: named as `orLaunchHostFuncNamed`
/// names it (null: "host function"), and declaring the `count` ranges of
/// memory at `accesses` it reads and writes, which the stream sanitizer
/// checks (Note [Stream sanitizer]); `accesses` may be null when `count`
/// is 0.
#[no_mangle]
pub extern "C" fn orLaunchKernel(
    stream: *const c_void,
    func: Option<HostFn>,
    user_data: *mut c_void,
    release: Option<ReleaseFn>,
    name: *const c_char,
    accesses: *const MemAccess,
    count: usize,
) -> OrError {
    let Some(release) = release else {
        return guarded(|| {
            Err(Error::invalid_value(
                "orLaunchKernel: the release function is null",
            ))
        });
    };
    let owned = OwnedUserData {
        data: SendPtr(user_data),
        release,
    };
    let name = host_function_name(name);
    guarded(move || {
        let accesses = match count {
            0 => &[][..],
            _ if accesses.is_null() => {
                return Err(Error::invalid_value(format!(
                    "orLaunchKernel: {count} accesses at a null pointer"
                )))
            }
            // SAFETY: the caller passes `count` readable orMemAccess.
            _ => unsafe { std::slice::from_raw_parts(accesses, count) },
        };
        let buffers: Vec<crate::diagnostics::sanitizer::KernelBuffer> = accesses
            .iter()
            .map(|a| crate::diagnostics::sanitizer::KernelBuffer {
                address: a.ptr as usize,
                bytes: a.bytes,
                written: a.written != 0,
                tensor: 0,
            })
            .collect();
        launch_owned(stream, func, owned, name, &buffers, "orLaunchKernel")
    })
}

/// Queues `func(owned)` on `stream`, after the sanitizer checked `buffers`.
fn launch_owned(
    stream: *const c_void,
    func: Option<HostFn>,
    owned: OwnedUserData,
    name: TaskName,
    buffers: &[crate::diagnostics::sanitizer::KernelBuffer],
    call: &str,
) -> Result<()> {
    let s = stream_arg(stream)?;
    let func =
        func.ok_or_else(|| Error::invalid_value(format!("{call}: the host function is null")))?;
    crate::diagnostics::sanitizer::check_launch(s, name, buffers, &|_| String::new())?;
    let work: crate::runtime::graph::Work = Box::new(move || {
        let owned = &owned; // the whole value: it is what is Send
        func(owned.data.0);
        Ok(())
    });
    let task = Task::Run(crate::runtime::profiler::timed(name.text().into_owned(), s, work));
    s.submit_named(task, name, move || name.text().into_owned())
        .map(drop)
}

/// The host process is about to finalize: drains every stream, then makes
/// `orKernelReleaseBegin` answer 0 (Note [Host exit] in lifecycle.rs).
#[no_mangle]
pub extern "C" fn orPrepareHostExit() -> OrError {
    guarded(|| {
        crate::runtime::lifecycle::prepare_host_exit();
        Ok(())
    })
}

/// 1: a host function may destroy what it captured now (then call
/// `orKernelReleaseEnd`); 0: the host is exiting, leak it instead.
#[no_mangle]
pub extern "C" fn orKernelReleaseBegin() -> c_int {
    crate::runtime::lifecycle::begin_kernel_release() as c_int
}

#[no_mangle]
pub extern "C" fn orKernelReleaseEnd() {
    crate::runtime::lifecycle::end_kernel_release()
}

/// Later work on `stream` waits for the event's recorded point; the stream
/// may belong to another device than the event (as `cudaStreamWaitEvent`).
#[no_mangle]
pub extern "C" fn orStreamWaitEvent(stream: *const c_void, event: *const c_void) -> OrError {
    guarded(|| event_arg(event)?.block(stream_arg(stream)?))
}

/// A new event of the current device; `flags` may hold `orEventDisableTiming`.
#[no_mangle]
pub extern "C" fn orEventCreate(event: *mut *mut c_void, flags: c_uint) -> OrError {
    guarded(|| {
        let timing = flags & OR_EVENT_DISABLE_TIMING == 0;
        let created = Event::new(device::current_device().into(), timing)?;
        put(event, handle::into_raw(created) as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn orEventRecord(event: *const c_void, stream: *const c_void) -> OrError {
    guarded(|| event_arg(event)?.record(stream_arg(stream)?))
}

/// `orSuccess` if the event's current version is complete (or it was never
/// recorded), else `orErrorNotReady`.
#[no_mangle]
pub extern "C" fn orEventQuery(event: *const c_void) -> OrError {
    guarded(|| match event_arg(event)?.query()? {
        true => Ok(()),
        false => Err(Error::new(
            ErrorKind::NotReady,
            "the event has not completed",
        )),
    })
}

#[no_mangle]
pub extern "C" fn orEventSynchronize(event: *const c_void) -> OrError {
    guarded(|| {
        let event = event_arg(event)?;
        event.synchronize()
    })
}

#[no_mangle]
pub extern "C" fn orEventElapsedTime(
    ms: *mut f32,
    start: *const c_void,
    end: *const c_void,
) -> OrError {
    guarded(|| {
        put(
            ms,
            Event::elapsed_ms(&*event_arg(start)?, &*event_arg(end)?)? as f32,
        )
    })
}

#[no_mangle]
pub extern "C" fn orEventDestroy(event: *mut c_void) -> OrError {
    guarded(|| handle::release(event as usize))
}

/// `size` bytes of device memory on the current device, for its current
/// stream (like `cudaMalloc`, but stream-ordered reuse as in PyTorch's cache).
#[no_mangle]
pub extern "C" fn orMalloc(ptr: *mut *mut c_void, size: usize) -> OrError {
    guarded(|| {
        let stream = stream::current(-1)?;
        let got = device::context(stream.device().into())?
            .allocator
            .malloc(size, stream)
            .map_err(|e| e.error)?;
        put(ptr, got as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn orFree(ptr: *mut c_void) -> OrError {
    guarded(|| crate::runtime::allocator::free_anywhere(ptr as usize))
}

/// Free and total bytes of the current device.
#[no_mangle]
pub extern "C" fn orMemGetInfo(free: *mut usize, total: *mut usize) -> OrError {
    guarded(|| {
        let (f, t) = device::context(device::current_device().into())?
            .allocator
            .memory_info();
        put(free, f)?;
        put(total, t)
    })
}

/// Caps what this process may reserve on `device` at `fraction` of it.
#[no_mangle]
pub extern "C" fn orSetMemoryFraction(device: c_int, fraction: f64) -> OrError {
    guarded(|| {
        device::context(device::resolve(device.into()))?
            .allocator
            .set_memory_fraction(fraction)
    })
}

/// The memory file behind device pointer `ptr` (valid while its allocation
/// lives; the runtime keeps it), the size of the mapping it backs, and the
/// offset of `ptr` in that mapping (Note [Shareable device memory]).
#[no_mangle]
pub extern "C" fn orIpcGetMemHandle(
    fd: *mut c_int,
    mapping_size: *mut usize,
    offset: *mut usize,
    ptr: *mut c_void,
) -> OrError {
    guarded(|| {
        let (file, base, len) = crate::memory::device_memory::shared_region(ptr as usize)?;
        put(fd, file)?;
        put(mapping_size, len)?;
        put(offset, ptr as usize - base)
    })
}

/// Maps, in this process, the `mapping_size` bytes of device memory another
/// process shares through memory file `fd` (from its orIpcGetMemHandle);
/// `*base` is the start of the mapping. The caller keeps `fd`.
#[no_mangle]
pub extern "C" fn orIpcOpenMemHandle(
    base: *mut *mut c_void,
    fd: c_int,
    mapping_size: usize,
) -> OrError {
    guarded(|| {
        put(
            base,
            crate::memory::device_memory::map_shared(fd, mapping_size)? as *mut c_void,
        )
    })
}

/// Releases a mapping made by orIpcOpenMemHandle.
#[no_mangle]
pub extern "C" fn orIpcCloseMemHandle(base: *mut c_void) -> OrError {
    guarded(|| {
        let len = crate::memory::device_memory::mapping_len(base as usize).ok_or_else(|| {
            Error::invalid_value(format!("{base:p} is not a mapping from orIpcOpenMemHandle"))
        })?;
        crate::memory::device_memory::unmap(base as usize, len);
        Ok(())
    })
}

static OPTIONS_TEXT: Lazy<CString> = Lazy::new(|| {
    let text: String = options::get()
        .entries()
        .iter()
        .map(|e| {
            format!(
                "{}\t{}\t{}\t{}\n",
                e.name,
                e.value,
                options::get().source(e.name),
                e.help
            )
        })
        .collect();
    CString::new(text).unwrap_or_default()
});

/// The options in force, one per line: `NAME<TAB>value<TAB>source<TAB>meaning`
/// (source: "environment", "default" or "invalid": Note [Invalid options]).
#[no_mangle]
pub extern "C" fn orGetOptions() -> *const c_char {
    OPTIONS_TEXT.as_ptr()
}

// Diagnostics and device management beyond the CUDA runtime's basics.

/// The percentage (0..=100) of the last second during which a stream of
/// `device` had work (Note [Busy clock] in utilization.rs). Creates no context.
#[no_mangle]
pub extern "C" fn orDeviceGetUtilization(device: c_int, percent: *mut c_int) -> OrError {
    guarded(|| {
        let index = device::check_index(device::resolve(device.into()))?;
        let fraction = crate::runtime::utilization::busy_fraction(index, crate::runtime::utilization::WINDOW);
        put(percent, (fraction * 100.0).round() as c_int)
    })
}

/// Whether `device` can access memory of `peer` (always, for two valid devices).
#[no_mangle]
pub extern "C" fn orDeviceCanAccessPeer(
    can_access: *mut c_int,
    device: c_int,
    peer: c_int,
) -> OrError {
    guarded(|| {
        put(
            can_access,
            device::can_access_peer(device.into(), peer.into())? as c_int,
        )
    })
}

/// The fraction of `device`'s capacity this process may reserve.
#[no_mangle]
pub extern "C" fn orGetMemoryFraction(device: c_int, fraction: *mut f64) -> OrError {
    guarded(|| {
        put(
            fraction,
            device::context(device::resolve(device.into()))?
                .allocator
                .memory_fraction(),
        )
    })
}

/// Memory history (Note [Memory history]): `trace` 1 keeps the event trace;
/// `stacks` 0 none, 1 for allocations, 2 for allocations and frees;
/// `enabled` 0 stops recording and drops what was recorded.
#[no_mangle]
pub extern "C" fn orRecordMemoryHistory(
    enabled: c_int,
    trace: c_int,
    stacks: c_int,
    max_entries: usize,
) -> OrError {
    guarded(|| {
        let settings = (enabled != 0).then_some(crate::memory::history::Settings {
            trace: trace != 0,
            alloc_stacks: stacks >= 1,
            free_stacks: stacks >= 2,
            max_entries,
        });
        crate::memory::history::set(settings)?;
        if settings.is_none() {
            device::existing_contexts().for_each(|ctx| ctx.allocator.clear_history());
        }
        Ok(())
    })
}

/// Installs the function that returns the calling thread's stack for memory
/// history (null: none); see `memory::history::StackCollector`.
#[no_mangle]
pub extern "C" fn orSetStackCollector(collector: Option<crate::memory::history::StackCollector>) {
    crate::memory::history::set_stack_collector(collector)
}

thread_local! {
    static SNAPSHOT: RefCell<CString> = RefCell::new(CString::default());
}

/// A JSON snapshot of every device's allocator (segments with blocks) and
/// recorded events, valid until this thread's next call. Creates no context.
#[no_mangle]
pub extern "C" fn orMemorySnapshot(json: *mut *const c_char) -> OrError {
    guarded(|| {
        let devices: Vec<_> = (0..device::device_count() as i64)
            .map(|i| match device::has_primary_context(i) {
                Ok(true) => device::context(i).ok().map(|ctx| ctx.allocator.snapshot()),
                _ => None,
            })
            .collect();
        let text = CString::new(crate::memory::history::to_json(&devices)).unwrap_or_default();
        SNAPSHOT.with(|slot| {
            *slot.borrow_mut() = text;
            put(json, slot.borrow().as_ptr())
        })
    })
}

/// 0 "default", 1 "warn", 2 "error" (Note [Sync debug]).
#[no_mangle]
pub extern "C" fn orSetSyncDebugMode(mode: c_int) -> OrError {
    use crate::diagnostics::sync_debug::SyncDebugMode;
    guarded(|| {
        let mode = match mode {
            0 => SyncDebugMode::Default,
            1 => SyncDebugMode::Warn,
            2 => SyncDebugMode::Error,
            other => {
                return Err(Error::invalid_value(format!(
                    "sync debug mode {other} is invalid (expected 0, 1 or 2)"
                )))
            }
        };
        crate::diagnostics::sync_debug::set_mode(mode);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn orGetSyncDebugMode() -> c_int {
    crate::diagnostics::sync_debug::mode() as c_int
}

/// Stops `device` (Note [Stopped devices]): its queued work is abandoned
/// (reported by each stream's next synchronize) and new work for it fails
/// with `orErrorDeviceStopped` until `orDeviceRestart`.
#[no_mangle]
pub extern "C" fn orDeviceStop(device: c_int) -> OrError {
    guarded(|| crate::runtime::device_stop::stop(device.into()).map(drop))
}

/// Brings back a stopped `device`; its memory allocated before is unusable.
#[no_mangle]
pub extern "C" fn orDeviceRestart(device: c_int) -> OrError {
    guarded(|| crate::runtime::device_stop::restart(device.into()))
}

#[no_mangle]
pub extern "C" fn orDeviceIsStopped(device: c_int, stopped: *mut c_int) -> OrError {
    guarded(|| {
        put(
            stopped,
            crate::runtime::device_stop::is_stopped(device::check_index(device.into())?) as c_int,
        )
    })
}

/// Releases the runtime now, in priority order (drains and stops the
/// streams, returns cached memory), for embedders that tear down before
/// process exit. Later device work fails with an error. Idempotent.
#[no_mangle]
pub extern "C" fn orFinalize() -> OrError {
    guarded(|| {
        crate::runtime::lifecycle::finalize();
        Ok(())
    })
}

/// `orHostMemoryStats` of include/openreg.h: each statistic is
/// `[current, peak, allocated, freed]`.
#[repr(C)]
pub struct HostMemoryStats {
    pub allocations: [i64; 4],
    pub allocated_bytes: [i64; 4],
    pub num_host_alloc: i64,
    pub num_host_free: i64,
}

/// Statistics of the pinned host allocator.
#[no_mangle]
pub extern "C" fn orGetHostMemoryStats(stats: *mut HostMemoryStats) -> OrError {
    let flat = |s: crate::runtime::allocator::Stat| [s.current, s.peak, s.allocated, s.freed];
    guarded(|| {
        let s = crate::memory::pinned::stats();
        put(
            stats,
            HostMemoryStats {
                allocations: flat(s.allocations),
                allocated_bytes: flat(s.allocated_bytes),
                num_host_alloc: s.num_host_alloc,
                num_host_free: s.num_host_free,
            },
        )
    })
}

/// `peak` 1: peaks drop to current values; `accumulated` 1: totals restart at 0.
#[no_mangle]
pub extern "C" fn orResetHostMemoryStats(peak: c_int, accumulated: c_int) -> OrError {
    guarded(|| {
        if peak != 0 {
            crate::memory::pinned::reset_peak_stats();
        }
        if accumulated != 0 {
            crate::memory::pinned::reset_accumulated_stats();
        }
        Ok(())
    })
}

/// Arms an injected fault (Note [Injected faults]): `kind` is "alloc",
/// "kernel", "event" or "enumerate"; `after` more operations of that kind
/// succeed, the next one fails.
#[no_mangle]
pub extern "C" fn orInjectFault(kind: *const c_char, after: u64) -> OrError {
    guarded(|| {
        // SAFETY: a non-null `kind` is a NUL-terminated string (the C contract).
        let name = unsafe { kind.as_ref().map(|k| CStr::from_ptr(k)) }
            .ok_or_else(|| Error::invalid_value("orInjectFault: the fault kind is null"))?;
        crate::diagnostics::fault::inject(
            crate::diagnostics::fault::Fault::from_name(&name.to_string_lossy())?,
            after,
        );
        Ok(())
    })
}

/// Synchronizing calls give up on a kernel running longer than `ms`
/// milliseconds (0: never), with an error naming the stream (Note [Op timeout]).
#[no_mangle]
pub extern "C" fn orSetOpTimeoutMs(ms: u64) {
    crate::runtime::op_timeout::set_ms(ms)
}

#[no_mangle]
pub extern "C" fn orGetOpTimeoutMs() -> u64 {
    crate::runtime::op_timeout::get_ms()
}

/// Live graph handles of the C ABI: a handle is the address of a boxed
/// executable graph, valid only while listed here (so a destroyed or
/// garbage handle is `orErrorInvalidHandle`, never a dangling read).
static GRAPH_HANDLES: Lazy<
    parking_lot::Mutex<std::collections::HashMap<usize, Arc<crate::runtime::graph::Executable>>>,
> = Lazy::new(Default::default);

fn new_graph_handle(executable: Arc<crate::runtime::graph::Executable>) -> *mut c_void {
    let boxed = Box::new(0u8); // a unique address for the handle
    let handle = Box::into_raw(boxed) as usize;
    GRAPH_HANDLES.lock().insert(handle, executable);
    handle as *mut c_void
}

fn graph_arg(handle: *const c_void) -> Result<Arc<crate::runtime::graph::Executable>> {
    GRAPH_HANDLES
        .lock()
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidHandle,
                format!("{handle:p} is not a live openreg graph handle"),
            )
        })
}

fn destroy_graph_handle(handle: *const c_void) -> Result<()> {
    let executable = GRAPH_HANDLES.lock().remove(&(handle as usize));
    match executable {
        Some(executable) => {
            // SAFETY: listed handles are addresses from Box::into_raw above.
            drop(unsafe { Box::from_raw(handle as *mut u8) });
            drop(executable); // outside the registry's lock: may release the pool
            Ok(())
        }
        None => Err(Error::new(
            ErrorKind::InvalidHandle,
            format!("{handle:p} is not a live openreg graph handle"),
        )),
    }
}

#[no_mangle]
pub extern "C" fn orStreamBeginCapture(stream: *const c_void, mode: c_int) -> OrError {
    guarded(|| {
        let mode = match mode {
            0 => crate::runtime::graph::CaptureMode::Global,
            1 => crate::runtime::graph::CaptureMode::ThreadLocal,
            2 => crate::runtime::graph::CaptureMode::Relaxed,
            _ => {
                return Err(Error::invalid_value(format!(
                    "orStreamBeginCapture: unknown capture mode {mode}"
                )))
            }
        };
        crate::runtime::graph::begin_capture(stream_arg(stream)?, mode, (0, 0), false).map(drop)
    })
}

#[no_mangle]
pub extern "C" fn orStreamEndCapture(stream: *const c_void, graph: *mut *mut c_void) -> OrError {
    guarded(|| {
        if graph.is_null() {
            return Err(Error::invalid_value("a required output pointer is null"));
        }
        let executable = crate::runtime::graph::end_capture(stream_arg(stream)?)?;
        put(graph, new_graph_handle(Arc::new(executable)))
    })
}

#[no_mangle]
pub extern "C" fn orStreamIsCapturing(stream: *const c_void, capturing: *mut c_int) -> OrError {
    guarded(|| {
        put(
            capturing,
            crate::runtime::graph::is_capturing(stream_arg(stream)?) as c_int,
        )
    })
}

#[no_mangle]
pub extern "C" fn orGraphGetNodeCount(graph: *const c_void, count: *mut usize) -> OrError {
    guarded(|| put(count, graph_arg(graph)?.node_count()))
}

/// An executable graph shares the captured one's recorded work (launches
/// of either are ordered among themselves).
#[no_mangle]
pub extern "C" fn orGraphInstantiate(exec: *mut *mut c_void, graph: *const c_void) -> OrError {
    guarded(|| {
        let executable = graph_arg(graph)?;
        if exec.is_null() {
            return Err(Error::invalid_value("a required output pointer is null"));
        }
        put(exec, new_graph_handle(executable))
    })
}

#[no_mangle]
pub extern "C" fn orGraphLaunch(exec: *const c_void, stream: *const c_void) -> OrError {
    guarded(|| graph_arg(exec)?.launch(stream_arg(stream)?))
}

#[no_mangle]
pub extern "C" fn orGraphExecDestroy(exec: *const c_void) -> OrError {
    guarded(|| destroy_graph_handle(exec))
}

#[no_mangle]
pub extern "C" fn orGraphDestroy(graph: *const c_void) -> OrError {
    guarded(|| destroy_graph_handle(graph))
}

#[no_mangle]
pub extern "C" fn orGraphPoolHandle(first: *mut u64, second: *mut u64) -> OrError {
    guarded(|| {
        let (a, b) = crate::runtime::graph::new_pool_handle();
        put(first, a)?;
        put(second, b)
    })
}

// The stream sanitizer (Note [Stream sanitizer] in sanitizer.rs).

/// 0 off, 1 raise, 2 warn.
#[no_mangle]
pub extern "C" fn orSanitizerSetMode(mode: c_int) -> OrError {
    use crate::diagnostics::sanitizer::Mode;
    guarded(|| {
        let mode = match mode {
            0 => Mode::Off,
            1 => Mode::Raise,
            2 => Mode::Warn,
            other => {
                return Err(Error::invalid_value(format!(
                    "sanitizer mode {other} is invalid (expected 0 off, 1 raise or 2 warn)"
                )))
            }
        };
        crate::diagnostics::sanitizer::set_mode(mode);
        Ok(())
    })
}

/// The mode in force: 0 off, 1 raise, 2 warn.
#[no_mangle]
pub extern "C" fn orSanitizerGetMode() -> c_int {
    crate::diagnostics::sanitizer::mode() as c_int
}

/// The reports so far, by kind, in the order of `orSanitizerGetKindName`.
#[no_mangle]
pub extern "C" fn orSanitizerGetCounts(counts: *mut u64, len: usize) -> OrError {
    guarded(|| {
        let all = crate::diagnostics::sanitizer::counts();
        if counts.is_null() || len < all.len() {
            return Err(Error::invalid_value(format!(
                "orSanitizerGetCounts: needs room for {} counts",
                all.len()
            )));
        }
        // SAFETY: the caller's buffer holds `len` >= all.len() counts.
        unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), counts, all.len()) };
        Ok(())
    })
}

/// The name of report kind `kind` ("race", ...), or null past the last.
#[no_mangle]
pub extern "C" fn orSanitizerGetKindName(kind: usize) -> *const c_char {
    crate::diagnostics::sanitizer::KIND_NAMES
        .get(kind)
        .map_or(std::ptr::null(), |n| n.as_ptr())
}

thread_local! {
    static REPORT: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// How many reports are kept.
#[no_mangle]
pub extern "C" fn orSanitizerGetReportCount() -> usize {
    crate::diagnostics::sanitizer::reports().len()
}

/// Report `index`'s text, valid until the next call on this thread.
#[no_mangle]
pub extern "C" fn orSanitizerGetReport(index: usize, text: *mut *const c_char) -> OrError {
    guarded(|| {
        let reports = crate::diagnostics::sanitizer::reports();
        let report = reports.get(index).ok_or_else(|| {
            Error::invalid_value(format!(
                "sanitizer report {index} does not exist ({} reports)",
                reports.len()
            ))
        })?;
        let owned = CString::new(report.replace('\0', " ")).unwrap_or_default();
        let ptr = REPORT.with(|r| {
            *r.borrow_mut() = owned;
            r.borrow().as_ptr()
        });
        put(text, ptr)
    })
}

/// Drops the reports and counts.
#[no_mangle]
pub extern "C" fn orSanitizerClear() {
    crate::diagnostics::sanitizer::clear()
}

/// Installs the function that gives the Python line of the calling host
/// code for reports (null: none); see `sanitizer::SourceCollector`.
#[no_mangle]
pub extern "C" fn orSanitizerSetSourceCollector(
    collector: Option<crate::diagnostics::sanitizer::SourceCollector>,
) {
    crate::diagnostics::sanitizer::set_source_collector(collector)
}
