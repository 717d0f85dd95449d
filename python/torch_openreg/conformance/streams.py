"""Streams and events: what `torch.Stream`, `torch.Event` and the current
stream of `torch.accelerator` promise.

The work the checks queue is a chain of matrix products by a cyclic shift
matrix (`rolled`): real, device-agnostic work whose every intermediate
differs and whose result, `torch.roll` of small integers, is exact in any
float precision. A result is read back either by a blocking copy or by a
non-blocking copy into host memory that the check reads only after the
synchronization under test, so a synchronization that returns early is seen.

Only `query_honest` calls `Stream.query()` and only `timing_events` calls
`Event.elapsed_time`: a backend that hangs or crashes there fails that one
check. The helpers `new_stream`, `unless_unsupported`, `integers`, `rolled`
and `host_buffer` serve the stream_order area too.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager

import torch

from torch_openreg.conformance._api import Failed, NotSupported, check, expect, first_line

AREA = "streams"

# torch's words for an interface method a backend did not implement
# ("Backend doesn't support create a new Stream.", "... doesn't support events.").
_UNSUPPORTED = re.compile(r"doesn't support|does not support|not supported", re.IGNORECASE)


@contextmanager
def unless_unsupported(what: str):
    """Turns torch's "doesn't support" RuntimeError into NotSupported(what: message)."""
    try:
        yield
    except RuntimeError as error:
        if _UNSUPPORTED.search(str(error)):
            raise NotSupported(f"{what}: {first_line(error)}") from None
        raise


def new_stream(b, index: int, priority: int = 0) -> torch.Stream:
    """A stream from device `index`'s pool, or NotSupported if the backend has none."""
    with unless_unsupported("torch.Stream(device=...) (a stream besides the current one)"):
        return torch.Stream(device=b.device(index), priority=priority)


def integers(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A CPU float tensor of integers in [0, 200): exact in bf16, TF32 and wider."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 200, (rows, cols), generator=generator).float()


def rolled(x: torch.Tensor, rounds: int) -> torch.Tensor:
    """torch.roll(x, rounds, dims=1), computed as `rounds` products by the cyclic shift matrix."""
    shift = torch.roll(torch.eye(x.shape[1], device=x.device, dtype=x.dtype), 1, dims=1)
    for _ in range(rounds):
        x = x @ shift
    return x


def host_buffer(like: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """An empty host tensor shaped as `like`: pinned when the backend offers pinned memory
    (so a non-blocking copy into it is truly asynchronous), else pageable."""
    try:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True), True
    except RuntimeError:
        return torch.empty(like.shape, dtype=like.dtype), False


def _queue_download(stream: torch.Stream, seed: int, n: int = 512, rounds: int = 6):
    """Queues on `stream` an upload, `rounds` products and a non-blocking copy of the result
    into host memory; returns (host tensor, its expected value, whether it is pinned)."""
    x_cpu = integers(n, n, seed)
    with stream:
        y = rolled(x_cpu.to(stream.device), rounds)
        out, pinned = host_buffer(y)
        out.copy_(y, non_blocking=True)
    return out, torch.roll(x_cpu, rounds, dims=1), pinned


def devices(b) -> str:
    """'device 0' or 'devices 0-N', for messages."""
    return f"devices 0-{b.device_count - 1}" if b.device_count > 1 else "device 0"


def _memory_word(pinned: bool) -> str:
    return "pinned" if pinned else "pageable (the backend has no pinned memory, so the copy may have been synchronous)"


@check("current_stream(i) is a stream of device i, the same one on each call, and the default stream when none was set")
def default_stream(b):
    default_of = getattr(b.module, "default_stream", None)
    for i in range(b.device_count):
        current = torch.accelerator.current_stream(i)
        expect(current.device == b.device(i), f"current_stream({i}) is a stream of {current.device}")
        again = torch.accelerator.current_stream(b.device(i))
        expect(again == current, f"current_stream({i}) is {current}, then {again}")
        if default_of is not None:
            default = default_of(i)
            expect(default == current, f"with no stream set, current_stream({i}) is {current}, not "
                                       f"torch.{b.name}.default_stream({i}) ({default})")
    here = torch.accelerator.current_stream()
    expect(here == torch.accelerator.current_stream(torch.accelerator.current_device_index()),
           "current_stream() is not the current stream of the current device")
    compared = f"equal to torch.{b.name}.default_stream(i)" if default_of is not None else \
        f"not compared with a default stream (torch.{b.name}.default_stream is not defined)"
    return f"{devices(b)}, {compared}"


@check("set_stream(s) and `with s:` make s current on its device (and its device current), "
       "leave other devices' streams alone, and `with` restores the previous stream and device")
def set_and_restore(b):
    last = b.device_count - 1
    defaults = [torch.accelerator.current_stream(i) for i in range(b.device_count)]
    original_device = torch.accelerator.current_device_index()
    first, second, far = new_stream(b, 0), new_stream(b, 0), new_stream(b, last)

    def expect_current(streams: dict[int, torch.Stream], device: int, where: str) -> None:
        for i, wanted in streams.items():
            now = torch.accelerator.current_stream(i)
            expect(now == wanted, f"{where}: current_stream({i}) is {now}, expected {wanted}")
        now = torch.accelerator.current_device_index()
        expect(now == device, f"{where}: the current device is {now}, expected {device}")

    try:
        torch.accelerator.set_device_index(0)
        torch.accelerator.set_stream(first)
        expect_current({0: first}, 0, f"after set_stream({first})")
        with second:
            expect_current({0: second}, 0, "inside `with` a second stream of device 0")
        expect_current({0: first}, 0, "after `with` a second stream, the set stream")
        if last > 0:
            torch.accelerator.set_stream(far)
            expect_current({0: first, last: far}, last, f"after set_stream({far})")
            torch.accelerator.set_stream(defaults[last])
            torch.accelerator.set_device_index(0)
            # NB: torch's Stream.__enter__ does nothing, not even switch the
            # device, for a stream already current on its device (on a backend
            # with one stream per device, every stream).
            entered = last if far != defaults[last] else 0
            with second:
                with far:
                    expect_current({0: second, last: far}, entered, f"inside `with` a stream of device {last}")
                expect_current({0: second, last: defaults[last]}, 0, f"after `with` a stream of device {last}")
            expect_current({0: first, last: defaults[last]}, 0, "after the outer `with`")
    finally:
        for stream in defaults:
            torch.accelerator.set_stream(stream)
        torch.accelerator.set_device_index(original_device)
    return f"streams set and restored on {'devices 0 and ' if last else 'device '}{last}"


@check("torch.Stream(device=d) gives a working stream of device d, each time; torch.Stream() one of the current device")
def pool_streams(b):
    distinct = []
    for i in range(b.device_count):
        made = [new_stream(b, i) for _ in range(4)]
        for stream in made:
            expect(stream.device == b.device(i) and stream.device_index == i,
                   f"torch.Stream(device={b.device(i)}) is {stream}")
            with stream:
                t = torch.arange(64, device=b.device(i)) * 3
                got = t.cpu()
            expect(torch.equal(got, torch.arange(64) * 3), f"work on {stream} gave {got[:4].tolist()}...")
        distinct.append(len(set(made)))
    original_device = torch.accelerator.current_device_index()
    try:
        torch.accelerator.set_device_index(b.device_count - 1)
        unplaced = torch.Stream()
    finally:
        torch.accelerator.set_device_index(original_device)
    expect(unplaced.device == b.device(b.device_count - 1),
           f"torch.Stream() with device {b.device_count - 1} current is {unplaced}")
    return f"4 streams on each device, {devices(b)} ({'/'.join(map(str, distinct))} distinct)"


@check("with more than one stream priority, torch.Stream(priority=p) gives working streams at both ends of "
       "torch.NAME.stream_priority_range(), and no stream has two priorities")
def priorities(b):
    least, greatest = b.module_function("stream_priority_range")()
    if least == greatest:
        raise NotSupported(f"one stream priority: torch.{b.name}.stream_priority_range() is ({least}, {greatest})")
    expect(greatest < least, f"stream_priority_range() is ({least}, {greatest}); torch's convention is "
                             "(least, greatest) with a more negative number a higher priority")
    for i in range(b.device_count):
        # More creations than a pool usually holds: a backend that ignores the
        # priority hands one of these out again for the higher priority.
        low = [new_stream(b, i, least) for _ in range(64)]
        high = [new_stream(b, i, greatest) for _ in range(4)]
        both = set(low) & set(high)
        expect(not both, f"a stream of priority {least} on device {i} is also one of priority {greatest}: "
                         f"{sorted(map(str, both))}")
        for stream in high + low[:4]:
            expect(stream.device == b.device(i), f"torch.Stream(device={b.device(i)}, priority=...) is {stream}")
            with stream:
                got = (torch.ones(64, device=b.device(i)) * 5).cpu()
            expect(torch.equal(got, torch.full((64,), 5.0)), f"work on {stream} gave {got[:4].tolist()}...")
    return f"priorities {least} and {greatest} on {devices(b)}"


def _long_product_size(device: torch.device) -> tuple[int, float]:
    """The size n (a power of two from 1024 to 8192) at which one n x n product takes >= 30 ms
    on `device`, and how long it takes (the faster of two, after a warm-up)."""
    n = 1024
    while True:
        x = torch.ones(n, n, device=device)
        times = []
        for _ in range(3):
            torch.accelerator.synchronize(device)
            started = time.perf_counter()
            x @ x
            torch.accelerator.synchronize(device)
            times.append(time.perf_counter() - started)
        took = min(times[1:])
        if took >= 0.03 or n >= 8192:
            return n, took
        n *= 2


@check("Stream.query() is False only while work runs: once True, events recorded earlier are complete and "
       "synchronize() has nothing to wait for; True after synchronize()", timeout_s=30)
def query_honest(b):
    device = b.device(0)
    stream = torch.accelerator.current_stream(0)
    torch.accelerator.synchronize(0)
    with unless_unsupported("Stream.query()"):
        idle = stream.query()
    expect(idle, "query() is False for a stream whose device was just synchronized")
    n, product_s = _long_product_size(device)
    rounds = max(3, min(60, round(0.4 / product_s)))
    x_cpu = integers(n, n, seed=1)
    x = x_cpu.to(device)
    # How long synchronize() may still wait once query() said True: a host
    # descheduled between the two calls stretches it, an honest backend never
    # needs it, so a lie must show in every attempt.
    bound = max(product_s / 2, 0.02)
    for attempt in range(_QUERY_ATTEMPTS):
        first, true_after, earlier_done, waited, y = _query_until_true(stream, x, rounds, product_s)
        expect(earlier_done, "query() turned True while an event recorded on the stream before the last product "
                             "had not completed")
        if waited < bound:
            break
    else:
        raise Failed(f"query() turned True while work still ran: synchronize() then waited {waited * 1e3:.0f} ms "
                     f"(one product takes {product_s * 1e3:.0f} ms), in each of {_QUERY_ATTEMPTS} attempts")
    expect(stream.query(), "query() is False after synchronize()")
    expect(torch.equal(y.cpu(), torch.roll(x_cpu, rounds, dims=1)), "the queued products gave a wrong result")
    return f"query() was {first} with {rounds} products of {n}x{n} (~{rounds * product_s:.2f} s) queued, True " \
           f"{true_after:.2f} s later; synchronize() then waited {waited * 1e3:.1f} ms"


_QUERY_ATTEMPTS = 3


def _query_until_true(stream: torch.Stream, x: torch.Tensor, rounds: int, product_s: float):
    """Queues `rounds` products of x on `stream` and polls query() until True; returns the first
    query(), when it turned True, whether an event recorded before the last product was then
    complete, how long synchronize() then waited, and the result."""
    torch.accelerator.synchronize(x.device)
    # A backend that reports "nothing queued" as "done" lies while its last
    # task runs: the chain ends in one long product, with an event before it.
    y = rolled(x, rounds - 1)
    before_last = torch.Event()
    before_last.record(stream)
    y = rolled(y, 1)
    first = stream.query()
    started = time.perf_counter()
    give_up = started + 20 * rounds * product_s + 5
    while not stream.query():
        if time.perf_counter() > give_up:
            raise Failed(f"query() still False {give_up - started:.1f} s after {rounds * product_s:.2f} s of work")
        time.sleep(0.0005)
    true_after = time.perf_counter() - started
    earlier_done = before_last.query()
    waited_from = time.perf_counter()
    stream.synchronize()
    return first, true_after, earlier_done, time.perf_counter() - waited_from, y


@check("stream.synchronize(), event.synchronize() and torch.accelerator.synchronize(i) return only when the "
       "work queued before them is complete")
def synchronize_completes(b):
    side = new_stream(b, 0)
    out, expected, pinned = _queue_download(side, seed=2)
    with unless_unsupported("Stream.synchronize()"):
        side.synchronize()
    expect(torch.equal(out, expected), "after stream.synchronize() the non-blocking copy's host tensor is not "
                                       "the result")
    out, expected, _ = _queue_download(side, seed=3)
    with unless_unsupported("events"):
        done = side.record_event()
    done.synchronize()
    expect(torch.equal(out, expected), "after event.synchronize() the host tensor is not the result")
    for i in range(b.device_count):
        pending = [_queue_download(stream, seed=4 + i)
                   for stream in (torch.accelerator.current_stream(i), new_stream(b, i))]
        torch.accelerator.synchronize(i)
        for where, (out, expected, _) in zip(("the current stream", "a side stream"), pending):
            expect(torch.equal(out, expected), f"after torch.accelerator.synchronize({i}) the host tensor of work "
                                               f"on {where} is not the result")
    out, expected, _ = _queue_download(torch.accelerator.current_stream(), seed=9)
    torch.accelerator.synchronize()
    expect(torch.equal(out, expected), "after torch.accelerator.synchronize() the host tensor is not the result")
    return f"copies into {_memory_word(pinned)} host memory"


def _handed_over(producer: torch.Stream, consumer: torch.Stream, wait, seed: int) -> None:
    """Produces on `producer`, makes `consumer` wait by `wait(producer, consumer)` and reads the
    result there; the consumer must see the result, and pass the wait only after the work."""
    x_cpu = integers(512, 512, seed)
    with producer:
        y = rolled(x_cpu.to(producer.device), 6)
        with unless_unsupported("events"):
            produced = producer.record_event()
    wait(producer, consumer)
    with consumer:
        z = y * 2 + 1
        passed = consumer.record_event()
    passed.synchronize()
    expect(produced.query(), f"{consumer} passed its wait before the work on {producer} was complete")
    expect(torch.equal(z.cpu(), torch.roll(x_cpu, 6, dims=1) * 2 + 1),
           f"a result made on {producer} and read on {consumer} after the wait is wrong")


def _by_event(producer: torch.Stream, consumer: torch.Stream) -> None:
    consumer.wait_event(producer.record_event())


def _by_event_wait(producer: torch.Stream, consumer: torch.Stream) -> None:
    ready = torch.Event()
    ready.record(producer)
    ready.wait(consumer)


def _by_stream(producer: torch.Stream, consumer: torch.Stream) -> None:
    consumer.wait_stream(producer)


_WAITS = {"consumer.wait_event(e)": _by_event, "e.wait(consumer)": _by_event_wait,
          "consumer.wait_stream(producer)": _by_stream}


@check("a stream that waits (wait_event, Event.wait, wait_stream) for another stream of its device sees "
       "that stream's results")
def wait_stream_and_event(b):
    for i in range(b.device_count):
        producer, consumer = new_stream(b, i), new_stream(b, i)
        for seed, wait in enumerate(_WAITS.values()):
            _handed_over(producer, consumer, wait, seed)
        _handed_over(producer, torch.accelerator.current_stream(i), _by_stream, seed=7)
    return f"{', '.join(_WAITS)} and the current stream waiting, on {devices(b)}"


@check("a stream of one device that waits for an event or a stream of another device passes the wait only "
       "once the awaited work is complete")
def wait_across_devices(b):
    b.require_devices(2)
    for source, target in ((0, 1), (1, 0)):
        for name, wait in _WAITS.items():
            producer, consumer = new_stream(b, source), new_stream(b, target)
            with producer:
                rolled(torch.ones(512, 512, device=b.device(source)), 6)
                with unless_unsupported("events"):
                    produced = producer.record_event()
            wait(producer, consumer)
            passed = consumer.record_event()
            passed.synchronize()
            expect(produced.query(), f"a stream of device {target} passed {name} (on device {source}'s work) "
                                     "before that work was complete")
    return f"{', '.join(_WAITS)}, device 0 to 1 and 1 to 0"


@check("an event never recorded queries True and synchronizes at once; a recorded event takes its stream's "
       "device and queries True after synchronize(), on every device")
def event_query_synchronize(b):
    for i in range(b.device_count):
        event = torch.Event(device=b.device(i))
        expect(event.query(), f"an event of device {i} never recorded queries False")
        event.synchronize()
        stream = new_stream(b, i)
        for seed in range(2):  # a second record of the same event
            out, expected, _ = _queue_download(stream, seed=10 + seed)
            with unless_unsupported("events"):
                event.record(stream)
            expect(event.device == b.device(i), f"an event recorded on {stream} is an event of {event.device}")
            event.synchronize()
            expect(event.query(), f"an event recorded on {stream} queries False after synchronize()")
            expect(torch.equal(out, expected), f"after the event's synchronize() ({'first' if seed == 0 else 'second'}"
                                               " record) the work before it is not complete")
        with torch.accelerator.device_index(i):
            current = torch.Event()
            current.record()
        expect(current.device == b.device(i), f"Event.record() with device {i} current made an event of "
                                              f"{current.device}")
    return f"{devices(b)}, each event recorded twice"


@check("Event(enable_timing=True) pairs give elapsed_time in ms: >= 0, > 0 across real work and within the "
       "host's time; elapsed_time of events without timing, or not recorded, raises")
def timing_events(b):
    device = b.device(0)
    stream = torch.accelerator.current_stream(0)
    x = torch.ones(512, 512, device=device)
    times = []
    for _ in range(3):  # the first is a warm-up
        torch.accelerator.synchronize(0)
        started = time.perf_counter()
        rolled(x, 8)
        torch.accelerator.synchronize(0)
        times.append(time.perf_counter() - started)
    work_s = min(times[1:])
    start, end, idle = (torch.Event(enable_timing=True) for _ in range(3))
    with unless_unsupported("timing events"):
        started = time.perf_counter()
        start.record(stream)
        rolled(x, 8)
        end.record(stream)
        end.synchronize()
        idle.record(stream)
        idle.synchronize()
        window_ms = (time.perf_counter() - started) * 1e3
        across_work = start.elapsed_time(end)
    expect(0 < across_work <= window_ms + 1,
           f"elapsed_time across {work_s * 1e3:.1f} ms of work is {across_work} ms; the host saw {window_ms:.1f} ms")
    expect(across_work >= work_s * 1e3 / 10,
           f"elapsed_time across work that takes {work_s * 1e3:.1f} ms is {across_work} ms (not milliseconds?)")
    between = end.elapsed_time(idle)
    expect(0 <= between <= window_ms + 1, f"elapsed_time between two events with no work between is {between} ms")

    plain, plain_end, unrecorded = torch.Event(), torch.Event(), torch.Event(enable_timing=True)
    plain.record(stream)
    plain_end.record(stream)
    plain_end.synchronize()
    refused = []
    for what, first, second in (("two events without timing", plain, plain_end),
                                ("a timing event and one without", start, plain_end),
                                ("an event never recorded", start, unrecorded)):
        try:
            first.elapsed_time(second)
        except (RuntimeError, ValueError) as error:
            refused.append(type(error).__name__)
            continue
        raise Failed(f"elapsed_time of {what} did not raise")
    return f"{across_work:.2f} ms across {work_s * 1e3:.1f} ms of work; refusals raised " \
           f"{', '.join(sorted(set(refused)))}"


@check("recording an event of one device on a stream of another device raises, and leaves the event as it was")
def event_device_mismatch_raises(b):
    b.require_devices(2)
    event = torch.Event()
    with unless_unsupported("events"):
        event.record(torch.accelerator.current_stream(0))
    try:
        event.record(new_stream(b, 1))
    except RuntimeError as error:
        expect(event.device == b.device(0), f"after the refused record the event is an event of {event.device}")
        event.synchronize()
        return f"raised {first_line(error)}"
    raise Failed(f"an event of {b.device(0)} was recorded on a stream of {b.device(1)} without an error")


@check("torch.Stream(device) and current_stream(i) for an index past the last device raise")
def bad_device_raises(b):
    past = b.device(b.device_count)
    raised = []
    for what, action in ((f"torch.Stream(device='{past}')", lambda: torch.Stream(device=past)),
                         (f"torch.accelerator.current_stream({b.device_count})",
                          lambda: torch.accelerator.current_stream(b.device_count))):
        try:
            action()
        except (RuntimeError, ValueError, IndexError) as error:
            raised.append(type(error).__name__)
            continue
        raise Failed(f"{what} did not raise")
    return f"each raised ({', '.join(sorted(set(raised)))})"
