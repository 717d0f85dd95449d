"""Python-side cost of the device guard paths, beside plain CPU PyTorch calls
measured in the same run (printed as ratios).

  python3 benches/bench_guard.py

Each figure is the median of several batches, per operation.
"""

import statistics
import time

import torch
import torch_openreg  # noqa: F401


def per_call_ns(fn, calls: int = 20000, batches: int = 7) -> float:
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        fn(calls)
        samples.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(samples)


def toggle_openreg(n: int) -> None:
    set_index = torch.accelerator.set_device_index
    for i in range(n):
        set_index(i & 1)


def toggle_cpu_threads(n: int) -> None:
    # Plain CPU PyTorch baseline: a setter of thread-local-ish runtime state.
    set_threads, k = torch.set_num_threads, torch.get_num_threads()
    for _ in range(n):
        set_threads(k)


def bare_torch_call(n: int) -> None:
    grad = torch.is_grad_enabled
    for _ in range(n):
        grad()


def pool_stream(n: int) -> None:
    for _ in range(n):
        torch.Stream(device="openreg:0")


def event_record_query(n: int) -> None:
    stream = torch.accelerator.current_stream(0)
    event = torch.Event(device="openreg")
    for _ in range(n):
        event.record(stream)
        event.query()


def event_record_sync(n: int) -> None:
    stream = torch.accelerator.current_stream(0)
    event = torch.Event(device="openreg")
    for _ in range(n):
        event.record(stream)
        event.synchronize()


def cpu_empty(n: int) -> None:
    for _ in range(n):
        torch.empty(0)


def main() -> None:
    torch.accelerator.set_device_index(0)
    torch.accelerator.synchronize(0)
    bare = per_call_ns(bare_torch_call)
    cpu_threads = per_call_ns(toggle_cpu_threads)
    cpu_alloc = per_call_ns(cpu_empty)
    rows = [
        ("torch.accelerator.set_device_index toggle 0<->1", per_call_ns(toggle_openreg), "torch.set_num_threads (same value)", cpu_threads),
        ("torch.Stream(device='openreg:0') from the pool", per_call_ns(pool_stream), "torch.empty(0) on CPU", cpu_alloc),
        ("Event.record + Event.query (idle stream)", per_call_ns(event_record_query), "torch.is_grad_enabled()", bare),
        ("Event.record + Event.synchronize (idle stream)", per_call_ns(event_record_sync), "torch.is_grad_enabled()", bare),
    ]
    print(f"{'openreg operation':50} {'ns/op':>9}   {'CPU PyTorch baseline':36} {'ns/op':>9} {'ratio':>7}")
    for name, ns, base_name, base_ns in rows:
        print(f"{name:50} {ns:9.0f}   {base_name:36} {base_ns:9.0f} {ns / base_ns:6.2f}x")


if __name__ == "__main__":
    main()
