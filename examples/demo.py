"""A tour of the openreg device through PyTorch's device-agnostic APIs.

Everything below is plain PyTorch (torch.accelerator, torch.Stream,
torch.Event) plus torch.openreg; nothing here knows openreg is simulated.
"""

import threading
import time

import torch
import torch_openreg  # noqa: F401  (also loaded by plain `import torch`)


def main() -> None:
    acc = torch.accelerator.current_accelerator()
    print(f"accelerator: {acc}, devices: {torch.accelerator.device_count()}")
    for i in range(torch.openreg.device_count()):
        print(f"  openreg:{i}: {torch.openreg.get_device_name(i)}")

    # Device switching, as with CUDA.
    with torch.accelerator.device_index(1):
        print(f"inside device_index(1): current device = {torch.accelerator.current_device_index()}")
    print(f"after it: current device = {torch.accelerator.current_device_index()}")

    # Two streams on openreg:1 run concurrently; events order them.
    producer = torch.Stream(device="openreg:1")
    consumer = torch.Stream(device="openreg:1", priority=-1)
    start, end = (torch.Event(device="openreg", enable_timing=True) for _ in range(2))
    ready = torch.Event(device="openreg")

    t0 = time.perf_counter()
    with producer:
        start.record()
        torch.openreg._sleep(100)  # a 100 ms "kernel"
        ready.record()
    with consumer:
        consumer.wait_event(ready)  # the consumer waits for the producer
        torch.openreg._sleep(50)
        end.record()
    queued_ms = (time.perf_counter() - t0) * 1e3
    print(f"queued 150 ms of work in {queued_ms:.2f} ms; consumer idle? {consumer.query()}")
    end.synchronize()
    print(f"producer→consumer chain took {start.elapsed_time(end):.1f} ms on the device (expected ≈150)")

    # Each thread has its own current device.
    seen = {}

    def worker(name: str, index: int) -> None:
        torch.openreg.set_device(index)
        time.sleep(0.01)
        seen[name] = torch.openreg.current_device()

    threads = [threading.Thread(target=worker, args=(f"t{i}", i % 2)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"per-thread current devices: {seen}; main thread still on {torch.openreg.current_device()}")

    # Tensors, autograd and random numbers on openreg:1, as on a CUDA device.
    torch.openreg.manual_seed_all(42)  # every device, as torch.cuda.manual_seed_all
    x = torch.randn(64, 16, device="openreg:1")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("openreg:1")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    target = x.sum(dim=1, keepdim=True)
    for step in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
    print(f"trained a small MLP on {x.device}: loss {loss.item():.4f}")
    torch.openreg.manual_seed_all(42)
    print(f"same seed, same numbers: {torch.equal(torch.randn(64, 16, device='openreg:1').cpu(), x.cpu())}")
    print(
        f"memory on openreg:1: {torch.openreg.memory_allocated(1)} bytes allocated, "
        f"{torch.openreg.memory_reserved(1)} reserved, peak {torch.openreg.max_memory_allocated(1)}"
    )

    # Bad input is a clear exception, not a crash.
    try:
        torch.accelerator.set_device_index(7)
    except RuntimeError as e:
        print(f"set_device_index(7) -> RuntimeError: {e}")

    torch.accelerator.synchronize()
    print("demo finished")


if __name__ == "__main__":
    main()
