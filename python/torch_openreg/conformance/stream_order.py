"""Stream order: correct multi-stream programs give correct results on every run.

Each check is a program that is correct under CUDA's stream semantics
(side-stream producers handing results over by events, wait_stream chains,
record_stream before freeing memory another stream still reads, non-blocking
copies between host and device, several host threads on one stream, copies
between devices under side streams), run 10 times (100 with --full) with
varied sizes and inputs, every result compared with CPU. The producers queue
real work (chains of products, see streams.rolled) ahead of what the
consumer reads, so on a backend whose streams run asynchronously a wait,
record_stream or copy ordering that does not hold gives a wrong result. On a
backend that runs work synchronously the programs pass trivially.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from torch_openreg.conformance._api import NotSupported, check, expect, first_line
from torch_openreg.conformance.streams import devices, host_buffer, integers, new_stream, rolled, unless_unsupported

AREA = "stream_order"

_ROUNDS = 4  # products in a producer's chain
_SIZES = (128, 192, 256, 320, 384)
_THREADS = 4


def _runs(b) -> range:
    return range(100 if b.full else 10)


def _size(run: int) -> int:
    return _SIZES[run % len(_SIZES)]


def _summary(b, where: str | None = None) -> str:
    return f"{len(_runs(b))} runs, sizes {_SIZES[0]}-{_SIZES[-1]}, {where or devices(b)}"


def _expect_equal(got: torch.Tensor, expected: torch.Tensor, run: int, what: str) -> None:
    if not torch.equal(got, expected):
        wrong = (got != expected).sum().item()
        expect(False, f"run {run} (size {got.shape[-1]}): {what}: {wrong} of {got.numel()} elements wrong")


@check("a result made on a side stream and handed over by an event is complete for the stream that waits for it")
def event_handoff(b):
    for run in _runs(b):
        device, n = b.device(run % b.device_count), _size(run)
        side = new_stream(b, device.index)
        x_cpu = integers(n, n, seed=run)
        with side:
            y = rolled(x_cpu.to(device), _ROUNDS)
            with unless_unsupported("events"):
                ready = side.record_event()
        torch.accelerator.current_stream(device).wait_event(ready)
        got = (y * 2 + 1).cpu()
        _expect_equal(got, torch.roll(x_cpu, _ROUNDS, dims=1) * 2 + 1, run, "the consumer read an incomplete result")
    return _summary(b)


@check("wait_stream over four streams (a chain that forks and joins again) orders each stage after the ones it reads")
def wait_stream_chain(b):
    for run in _runs(b):
        device, n = b.device(run % b.device_count), _size(run)
        first, left, right, last = (new_stream(b, device.index) for _ in range(4))
        x_cpu = integers(n, n, seed=run)
        with first:
            a = rolled(x_cpu.to(device), _ROUNDS)
        with unless_unsupported("events (wait_stream records one)"):
            left.wait_stream(first)
        with left:
            c = rolled(a, _ROUNDS) + 1
        right.wait_stream(first)
        with right:
            d = rolled(a, _ROUNDS) * 2
        last.wait_stream(left)
        last.wait_stream(right)
        with last:
            e = c + d
        torch.accelerator.current_stream(device).wait_stream(last)
        got = e.cpu()
        _expect_equal(got, torch.roll(x_cpu, 2 * _ROUNDS, dims=1) * 3 + 1, run, "a stage read an earlier one early")
    return _summary(b)


@check("memory freed after record_stream(side) is not handed out again until the side stream's use is done")
def record_stream_reuse(b):
    for run in _runs(b):
        device, n = b.device(run % b.device_count), _size(run)
        main = torch.accelerator.current_stream(device)
        side = new_stream(b, device.index)
        x_cpu = integers(n, n, seed=run)
        x = x_cpu.to(device)  # made on the current stream, read on the side stream
        with unless_unsupported("events (wait_stream records one)"):
            side.wait_stream(main)
        with side:
            # The side stream reads x only after this queued work, so memory
            # reused too early is overwritten before the read.
            delay = rolled(torch.ones(n, n, device=device), _ROUNDS)
            y = x + delay
        try:
            x.record_stream(side)
        except NotImplementedError as error:  # no aten::record_stream kernel for the backend
            raise NotSupported(f"Tensor.record_stream: {first_line(error)}") from None
        del x
        torch.full((n, n), -7.0, device=device)  # the same size as x: its memory, if handed out again now
        main.wait_stream(side)
        got = y.cpu()
        _expect_equal(got, x_cpu + 1, run, "the side stream read memory re-allocated and overwritten on the "
                                           "current stream")
    return _summary(b)


@check("non-blocking copies host->device and device->host, ordered by streams and events, give the result "
       "once the last copy's event is synchronized")
def non_blocking_copies(b):
    for run in _runs(b):
        device, n = b.device(run % b.device_count), _size(run)
        upload, download = new_stream(b, device.index), new_stream(b, device.index)
        x_cpu = integers(n, n, seed=run)
        source, pinned = host_buffer(x_cpu)
        source.copy_(x_cpu)
        with upload:
            y = rolled(source.to(device, non_blocking=True), _ROUNDS) + 1
            with unless_unsupported("events"):
                computed = upload.record_event()
        download.wait_event(computed)
        with download:
            out, _ = host_buffer(y)
            out.copy_(y, non_blocking=True)
            copied = download.record_event()
        copied.synchronize()
        _expect_equal(out, torch.roll(x_cpu, _ROUNDS, dims=1) + 1, run, "the host tensor of the last copy")
    memory = "pinned" if pinned else "pageable (no pinned memory)"
    return f"{_summary(b)}, {memory} host memory"


@check(f"{_THREADS} host threads queueing on one stream, each handing its results to its own stream, "
       "each get correct results")
def host_threads(b):
    device = b.device(0)
    shared = new_stream(b, 0)

    def thread_work(thread: int) -> int:
        own = new_stream(b, 0)
        for run in _runs(b):
            n = _size(run + thread)
            x_cpu = integers(n, n, seed=_THREADS * run + thread)
            with shared:
                y = rolled(x_cpu.to(device), _ROUNDS) + thread
                with unless_unsupported("events"):
                    ready = shared.record_event()
            own.wait_event(ready)
            with own:
                got = (y * 2).cpu()
            _expect_equal(got, (torch.roll(x_cpu, _ROUNDS, dims=1) + thread) * 2, run, f"thread {thread}'s result")
        return thread

    with ThreadPoolExecutor(_THREADS) as pool:
        futures = [pool.submit(thread_work, thread) for thread in range(_THREADS)]
        for future in futures:
            future.result()  # re-raises a thread's Failed
    return f"{_THREADS} threads x {_summary(b, 'device 0')}"


@check("a copy between devices is ordered after the work it copies and before the work that reads the copy: "
       "with side streams of both devices current, or after the destination stream waited for an event")
def cross_device_copies(b):
    b.require_devices(2)
    for run in _runs(b):
        source, target = run % 2, 1 - run % 2
        n = _size(run)
        producer, consumer = new_stream(b, source), new_stream(b, target)
        x_cpu = integers(n, n, seed=run)
        expected = (torch.roll(x_cpu, _ROUNDS, dims=1) + 1) * 2
        with producer:
            y = rolled(x_cpu.to(b.device(source)), _ROUNDS) + 1
            with consumer:
                both_current = y.to(b.device(target)) * 2
        with producer:
            # A second tensor, not y again: y stays allocated until the host has
            # waited, whichever device's stream ran its copy.
            y_again = rolled(x_cpu.to(b.device(source)), _ROUNDS) + 1
            with unless_unsupported("events"):
                ready = producer.record_event()
        # The source device's current stream did not wait for the producer:
        # CUDA orders a copy between devices after the current streams of both
        # devices, so the consumer's wait covers the copy too.
        consumer.wait_event(ready)
        with consumer:
            handed_over = y_again.to(b.device(target)) * 2
        torch.accelerator.current_stream(target).wait_stream(consumer)
        _expect_equal(both_current.cpu(), expected, run, f"the copy from device {source} to {target} under both "
                                                         "side streams")
        _expect_equal(handed_over.cpu(), expected, run, f"the copy from device {source} to {target} after the event")
    return _summary(b, "device 0 to 1 and 1 to 0")
