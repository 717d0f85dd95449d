"""Device memory and the caching allocator (Note [Caching allocator]).

Statistics are exact, so the expected numbers are too: every block is a
multiple of 512 bytes; requests up to 1 MiB come from 2 MiB segments of the
small pool, 1-10 MiB from 20 MiB segments of the large pool, 10 MiB and more
from a segment of the request rounded up to 2 MiB.

In-process tests only rely on what is exact whatever earlier tests left in
the cache (allocated bytes, counts); reserved memory, block reuse and
out-of-memory are checked in fresh subprocesses.
"""

import gc

import pytest
import torch

from _openreg_util import clean_env, run_threads, script

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
DEFAULT_CAPACITY = 4 * GiB

STAT_ARRAYS = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
]
POOLS = ["all", "small_pool", "large_pool"]
FIELDS = ["current", "peak", "allocated", "freed"]
SCALARS = ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"]
SINGLE_STATS = ["oversize_allocations", "oversize_segments"]


def stats(device=0):
    return torch.accelerator.memory_stats(device)


def allocated(device=0):
    return torch.openreg.memory_allocated(device)


def _bytes(n, device="openreg:0"):
    return torch.empty(n, dtype=torch.uint8, device=device)


@pytest.fixture(scope="module", autouse=True)
def _initialized():
    # Statistics are {} until a device has allocated once.
    torch.empty(1, device="openreg:0")
    torch.empty(1, device="openreg:1")


@pytest.fixture(autouse=True)
def _exact(exact_memory):
    """Statistics are compared exactly: no automatic gc in between."""


# ------------------------------------------------------------------ in-process


def test_stats_have_cudas_keys():
    s = stats(0)
    expected = {f"{a}.{p}.{f}" for a in STAT_ARRAYS for p in POOLS for f in FIELDS}
    expected |= {f"{a}.{f}" for a in SINGLE_STATS for f in FIELDS}
    expected |= set(SCALARS)
    missing = expected - set(s)
    assert not missing, sorted(missing)
    # all = small + large, for every statistic and field.
    for a in STAT_ARRAYS:
        for f in FIELDS:
            if f == "peak":
                continue  # peaks of the parts need not coincide
            assert s[f"{a}.all.{f}"] == s[f"{a}.small_pool.{f}"] + s[f"{a}.large_pool.{f}"], (a, f)


def test_openreg_functions_match_torch_accelerator():
    keep = _bytes(3 * MiB)  # noqa: F841  (something to count)
    for device in (0, 1):
        s = torch.accelerator.memory_stats(device)
        assert torch.openreg.memory_stats(device) == s
        assert torch.openreg.memory_allocated(device) == torch.accelerator.memory_allocated(device) == s["allocated_bytes.all.current"]
        assert torch.openreg.memory_reserved(device) == torch.accelerator.memory_reserved(device) == s["reserved_bytes.all.current"]
        assert torch.openreg.max_memory_allocated(device) == torch.accelerator.max_memory_allocated(device) == s["allocated_bytes.all.peak"]
        assert torch.openreg.max_memory_reserved(device) == torch.accelerator.max_memory_reserved(device) == s["reserved_bytes.all.peak"]
        assert torch.openreg.mem_get_info(device) == torch.accelerator.get_memory_info(device)
    # Device arguments in every form name the same device.
    for form in (1, "openreg:1", torch.device("openreg:1")):
        assert torch.openreg.memory_allocated(form) == torch.accelerator.memory_allocated(1)
    assert torch.openreg.memory_allocated() == torch.accelerator.memory_allocated(0)
    assert torch.openreg.memory_allocated(0) >= 3 * MiB


def test_mem_get_info_is_capacity_minus_reserved():
    for device in (0, 1):
        free, total = torch.openreg.mem_get_info(device)
        assert total == DEFAULT_CAPACITY
        assert free == total - torch.openreg.memory_reserved(device)


def test_device_properties_report_total_memory():
    assert torch.openreg.get_device_properties(0).total_memory == DEFAULT_CAPACITY


@pytest.mark.parametrize(
    "nbytes, block, pool",
    [
        (0, 0, None),
        (1, 512, "small_pool"),
        (100, 512, "small_pool"),
        (512, 512, "small_pool"),
        (513, 1024, "small_pool"),
        (4000, 4096, "small_pool"),
        (MiB, MiB, "small_pool"),
        (MiB + 1, MiB + 512, "large_pool"),
        (3 * MiB, 3 * MiB, "large_pool"),
        (12 * MiB + 7, 12 * MiB + 512, "large_pool"),
    ],
)
def test_allocation_is_rounded_to_512_bytes(nbytes, block, pool):
    before = stats(0)
    t = _bytes(nbytes)
    after = stats(0)
    assert after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == block
    assert after["active_bytes.all.current"] - before["active_bytes.all.current"] == block
    assert after["requested_bytes.all.current"] - before["requested_bytes.all.current"] == nbytes
    assert after["allocation.all.current"] - before["allocation.all.current"] == (1 if nbytes else 0)
    if pool is not None:
        assert after[f"allocated_bytes.{pool}.current"] - before[f"allocated_bytes.{pool}.current"] == block
        other = "large_pool" if pool == "small_pool" else "small_pool"
        assert after[f"allocated_bytes.{other}.current"] == before[f"allocated_bytes.{other}.current"]
        # Device pointers are at least 512-byte aligned.
        assert t.data_ptr() % 512 == 0
    assert t.untyped_storage().nbytes() == nbytes
    del t
    final = stats(0)
    for key in ("allocated_bytes.all.current", "requested_bytes.all.current", "allocation.all.current", "active.all.current"):
        assert final[key] == before[key], key
    assert final["allocated_bytes.all.freed"] - before["allocated_bytes.all.freed"] == block


def test_allocations_count_on_their_own_device():
    base0, base1 = allocated(0), allocated(1)
    a = _bytes(1000, "openreg:1")
    assert (allocated(0), allocated(1)) == (base0, base1 + 1024)
    with torch.openreg.device(1):
        b = torch.empty(256, dtype=torch.float32, device="openreg")  # the current device
        assert b.device == torch.device("openreg:1")
        assert torch.openreg.memory_allocated() == torch.accelerator.memory_allocated() == base1 + 2048
        assert torch.openreg.memory_stats()["allocated_bytes.all.current"] == base1 + 2048
    assert (allocated(0), allocated(1)) == (base0, base1 + 2048)
    c = torch.empty(256, device="openreg")
    assert c.device == torch.device("openreg:0")
    assert (allocated(0), allocated(1)) == (base0 + 1024, base1 + 2048)
    del a, b, c
    assert (allocated(0), allocated(1)) == (base0, base1)


def test_peak_and_reset_peak_memory_stats():
    torch.openreg.reset_peak_memory_stats(0)
    base = allocated(0)
    assert torch.openreg.max_memory_allocated(0) == base
    assert torch.openreg.max_memory_reserved(0) == torch.openreg.memory_reserved(0)
    x = _bytes(3 * MiB)
    y = _bytes(1000)
    del x
    assert allocated(0) == base + 1024
    assert torch.openreg.max_memory_allocated(0) == base + 3 * MiB + 1024
    assert stats(0)["allocated_bytes.large_pool.peak"] >= 3 * MiB
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.openreg.max_memory_allocated(0) == base + 1024
    assert stats(0)["allocation.all.peak"] == stats(0)["allocation.all.current"]
    del y
    # Peaks of device 1 are separate.
    torch.openreg.reset_peak_memory_stats(1)
    base1 = allocated(1)
    z = _bytes(2 * MiB, "openreg:1")
    del z
    assert torch.openreg.max_memory_allocated(1) == base1 + 2 * MiB
    assert torch.openreg.max_memory_allocated(0) == base + 1024


def test_reset_accumulated_memory_stats():
    x = _bytes(700)
    del x
    torch.openreg.reset_accumulated_memory_stats(0)
    s = stats(0)
    for a in STAT_ARRAYS:
        for p in POOLS:
            assert s[f"{a}.{p}.allocated"] == 0 and s[f"{a}.{p}.freed"] == 0, (a, p)
    for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"):
        assert s[key] == 0, key
    current = s["allocated_bytes.all.current"]
    assert current == allocated(0)  # current values survive the reset
    y = _bytes(700)
    z = _bytes(2 * MiB)
    del y
    s = stats(0)
    assert s["allocated_bytes.all.allocated"] == 1024 + 2 * MiB
    assert s["allocated_bytes.all.freed"] == 1024
    assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 1
    assert s["requested_bytes.all.allocated"] == 700 + 2 * MiB
    del z
    torch.accelerator.reset_accumulated_memory_stats(0)
    assert stats(0)["allocation.all.allocated"] == 0


def test_freed_blocks_are_reused_without_new_segments():
    x = _bytes(5000)
    del x
    y = _bytes(3 * MiB)
    del y
    reserved = torch.openreg.memory_reserved(0)
    mapped = stats(0)["num_device_alloc"]
    for _ in range(50):
        x = _bytes(5000)
        y = _bytes(3 * MiB)
        del x, y
    assert torch.openreg.memory_reserved(0) == reserved
    assert stats(0)["num_device_alloc"] == mapped


def test_empty_cache_returns_unused_segments():
    torch.openreg.empty_cache()
    r0 = torch.openreg.memory_reserved(0)
    mapped = stats(0)["num_device_alloc"]
    x = _bytes(24 * MiB)  # >= 10 MiB: a segment of its own, exactly its size
    assert stats(0)["num_device_alloc"] == mapped + 1
    assert torch.openreg.memory_reserved(0) == r0 + 24 * MiB
    assert torch.openreg.mem_get_info(0)[0] == DEFAULT_CAPACITY - r0 - 24 * MiB
    del x
    assert torch.openreg.memory_reserved(0) == r0 + 24 * MiB  # cached
    unmapped = stats(0)["num_device_free"]
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved(0) == r0
    assert stats(0)["num_device_free"] == unmapped + 1
    assert torch.openreg.mem_get_info(0)[0] == DEFAULT_CAPACITY - r0
    # What is left is held by live blocks only: empty_cache again frees nothing.
    torch.accelerator.empty_cache()
    assert torch.openreg.memory_reserved(0) == r0


def test_out_of_memory_in_process_leaves_usage_unchanged():
    before = stats(0)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(5 * GiB, dtype=torch.uint8, device="openreg:0")
    message = str(info.value)
    assert "device 0" in message and "5368709120 bytes" in message, message
    for word in ("allocated", "reserved", "free"):
        assert word in message, message
    after = stats(0)
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    # Still usable afterwards.
    assert torch.ones(3, device="openreg:0").sum().item() == 3.0


def _workload(device):
    a = torch.randn(64, 64).to(device)
    b = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64).to(device)
    c = a @ b + a.t() * 2
    c.add_(1)
    d = torch.cat([c, c]).sort(dim=0).values
    e = d[torch.tensor([0, 5, 7])].sum(dim=1)
    f = torch.empty(0, device=device)
    torch.mul(a, b, out=f)  # out= resized by the kernel
    g = c.clone()
    g.resize_(100, 100)
    g.untyped_storage().resize_(4 * 100 * 100 + 4000)
    h = c.to("cpu").to(device)
    w = torch.randn(8, 64, requires_grad=True, device=device)
    loss = torch.nn.functional.relu(w @ c).pow(2).mean()
    loss.backward()
    i = torch.empty(100, device=device)
    i.set_(c.untyped_storage(), 10, (5, 5), (5, 1))
    j = c.to("openreg:1" if str(device) == "openreg:0" else "openreg:0")
    return e.sum().item() + h.sum().item() + w.grad.sum().item() + i.sum().item() + j.sum().item()


@pytest.mark.parametrize("device", ["openreg:0", "openreg:1"])
def test_nothing_leaks(device):
    gc.collect()
    torch.openreg.synchronize(0)
    torch.openreg.synchronize(1)
    before = [stats(d) for d in (0, 1)]
    for _ in range(3):
        _workload(device)
    gc.collect()
    torch.openreg.synchronize(0)
    torch.openreg.synchronize(1)
    after = [stats(d) for d in (0, 1)]
    for d in (0, 1):
        for key in ("allocated_bytes.all.current", "requested_bytes.all.current", "allocation.all.current", "active.all.current"):
            assert after[d][key] == before[d][key], (d, key)
        assert after[d]["allocation.all.allocated"] - before[d]["allocation.all.allocated"] == (
            after[d]["allocation.all.freed"] - before[d]["allocation.all.freed"]
        )


def test_threads_allocating_concurrently_leak_nothing():
    gc.collect()
    before = [allocated(0), allocated(1)]

    def worker(i):
        def body():
            dev = f"openreg:{i % 2}"
            with torch.openreg.stream(torch.Stream(device=dev)):
                for k in range(60):
                    n = 1000 + 37 * k
                    a = torch.full((n,), float(i), device=dev)
                    b = a * 2 + 1
                    assert torch.cat([a, b]).sum().item() == n * (3 * i + 1)
                    big = torch.empty((2 << 20) + 4 * k, dtype=torch.uint8, device=dev)  # large pool
                    assert b.to(f"openreg:{(i + 1) % 2}").sum().item() == n * (2 * i + 1)
                    del a, b, big

        return body

    errors = run_threads([worker(i) for i in range(6)], timeout=60)
    assert not errors, errors
    torch.openreg.synchronize(0)
    torch.openreg.synchronize(1)
    gc.collect()
    assert [allocated(0), allocated(1)] == before
    torch.openreg.empty_cache()  # also settles frees deferred by record_stream in earlier tests
    for d in (0, 1):
        s = stats(d)
        # Every block is either allocated or free again: none stuck "active".
        assert s["active_bytes.all.current"] == s["allocated_bytes.all.current"]
        assert s["active.all.current"] == s["allocation.all.current"]


def test_set_per_process_memory_fraction_caps_reservations():
    # Device 1 has 4 GiB: half of it is 2 GiB, so 3 GiB cannot be reserved.
    try:
        torch.openreg.set_per_process_memory_fraction(0.5, "openreg:1")
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="openreg:1")
        with pytest.raises(torch.OutOfMemoryError, match=r"device 1.*\(2.00 GiB usable by this process\)"):
            torch.empty(3 * GiB, dtype=torch.uint8, device="openreg:1")
        del x
        # Device 0 is not limited by device 1's fraction.
        y = torch.empty(3 * GiB, dtype=torch.uint8, device="openreg:0")
        del y
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0, 1)
    z = torch.empty(3 * GiB, dtype=torch.uint8, device="openreg:1")
    assert torch.openreg.memory_allocated(1) >= 3 * GiB
    del z
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved(1) < 3 * GiB


# ------------------------------------------------------ fresh processes: exact

ALLOCATOR = script(
    "allocator_exact",
    """
    import torch, torch_openreg
    MiB = 1 << 20
    dev = "openreg:0"
    S = lambda: dict(torch.accelerator.memory_stats(0))
    b = lambda n, device=dev: torch.empty(n, dtype=torch.uint8, device=device)
    R = RESULT
    R["stats_before_use"] = len(torch.accelerator.memory_stats(0))
    R["allocated_before_use"] = torch.openreg.memory_allocated(0)

    x = b(100)
    s = S()
    R["small"] = [s["allocated_bytes.all.current"], s["allocated_bytes.small_pool.current"],
                  s["reserved_bytes.all.current"], s["reserved_bytes.small_pool.current"],
                  s["reserved_bytes.large_pool.current"], s["segment.small_pool.current"],
                  s["requested_bytes.all.current"], s["inactive_split_bytes.all.current"],
                  s["inactive_split.all.current"], s["num_device_alloc"]]
    R["mem_get_info"] = list(torch.openreg.mem_get_info(0))
    p = x.data_ptr()
    del x
    R["after_free"] = [S()["allocated_bytes.all.current"], S()["reserved_bytes.all.current"], S()["inactive_split.all.current"]]

    # Same stream: the freed block is reused, no new segment.
    y = b(300)
    R["reuse_same_stream"] = [y.data_ptr() == p, S()["reserved_bytes.all.current"], S()["num_device_alloc"]]
    del y

    # Another stream never gets a block freed by the default stream.
    side = torch.Stream(device=dev)
    with torch.openreg.stream(side):
        z = b(100)
    R["other_stream"] = [z.data_ptr() != p, S()["reserved_bytes.all.current"], S()["segment.all.current"], S()["num_device_alloc"]]
    del z

    # record_stream on an idle stream: reuse right away.
    a = b(4000)
    pa = a.data_ptr()
    a.record_stream(side)
    del a
    c = b(4000)
    R["record_idle_stream_reused"] = c.data_ptr() == pa
    del c

    # record_stream with work queued on that stream: reuse only after it ran.
    a = b(4000)
    pa = a.data_ptr()
    with torch.openreg.stream(side):
        torch.openreg._sleep(300)
    a.record_stream(side)
    del a
    R["pending_allocated"] = S()["allocated_bytes.all.current"]
    c = b(4000)
    R["pending_not_reused"] = c.data_ptr() != pa
    side.synchronize()
    d = b(4000)
    R["reused_after_stream_done"] = d.data_ptr() == pa
    del c, d

    # empty_cache releases every cached segment.
    torch.openreg.reset_accumulated_memory_stats(0)
    torch.openreg.empty_cache()
    s = S()
    R["empty_cache"] = [s["reserved_bytes.all.current"], s["segment.all.current"], s["num_device_free"],
                        s["reserved_bytes.all.freed"], torch.openreg.mem_get_info(0)[0]]

    # Segment sizes of each pool, one request at a time from an empty cache.
    sizes = {}
    for n in [1, MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB - 512, 10 * MiB, 10 * MiB + 1, 12 * MiB + 7, 25 * MiB]:
        t = b(n)
        s = S()
        sizes[str(n)] = [s["allocated_bytes.all.current"], s["reserved_bytes.all.current"],
                         s["reserved_bytes.small_pool.current"], s["reserved_bytes.large_pool.current"]]
        del t
        torch.openreg.empty_cache()

    R["sizes"] = sizes

    # Large pool: a 20 MiB segment is shared; a 12 MiB request gets its own 14 MiB one.
    torch.openreg.reset_peak_memory_stats(0)
    l1 = b(3 * MiB)
    l2 = b(5 * MiB)
    p1 = S()["reserved_bytes.all.current"]
    h = b(12 * MiB + 1)
    p2 = [S()["reserved_bytes.all.current"], S()["allocated_bytes.all.current"], S()["segment.large_pool.current"]]
    del h
    p3 = S()["reserved_bytes.all.current"]
    torch.openreg.empty_cache()
    p4 = S()["reserved_bytes.all.current"]
    del l1
    torch.openreg.empty_cache()
    p5 = S()["reserved_bytes.all.current"]  # l2 still holds the segment
    del l2
    torch.openreg.empty_cache()
    R["large"] = [p1] + p2 + [p3, p4, p5, S()["reserved_bytes.all.current"], torch.openreg.max_memory_reserved(0),
                  torch.openreg.max_memory_allocated(0)]

    # Blocks of one segment merge again when their neighbours are free.
    torch.openreg.empty_cache()
    a1, a2, a3 = b(512), b(512), b(512)
    splits = [S()["inactive_split.all.current"]]  # the rest of the segment
    del a1, a3
    splits.append(S()["inactive_split.all.current"])  # a1's block; a3 merged into the rest
    splits.append(S()["inactive_split_bytes.all.current"])
    del a2
    splits.append(S()["inactive_split.all.current"])  # one whole free segment
    torch.openreg.empty_cache()
    splits.append(S()["reserved_bytes.all.current"])
    u, v = b(MiB), b(MiB)  # exactly one 2 MiB segment
    R["halves"] = [S()["segment.all.current"], S()["inactive_split.all.current"], v.data_ptr() - u.data_ptr()]
    del u, v
    torch.openreg.empty_cache()
    splits.append(S()["reserved_bytes.all.current"])
    R["merge"] = splits
    R["end"] = [torch.openreg.memory_allocated(0), torch.openreg.memory_reserved(0), torch.openreg.memory_allocated(1)]
    done(RESULT)
    """,
)


@pytest.fixture(scope="module")
def exact():
    return ALLOCATOR.result().check_ok()


@pytest.mark.subprocess
def test_fresh_stats_are_empty_until_first_use(exact):
    assert exact["stats_before_use"] == 0
    assert exact["allocated_before_use"] == 0


@pytest.mark.subprocess
def test_small_request_maps_a_2mib_segment(exact):
    assert exact["small"] == [512, 512, 2 * MiB, 2 * MiB, 0, 1, 100, 2 * MiB - 512, 1, 1]
    assert exact["mem_get_info"] == [DEFAULT_CAPACITY - 2 * MiB, DEFAULT_CAPACITY]
    # Freed: cached, not returned; the split blocks merged back into one.
    assert exact["after_free"] == [0, 2 * MiB, 0]


@pytest.mark.subprocess
def test_freed_block_is_reused_on_its_stream_only(exact):
    assert exact["reuse_same_stream"] == [True, 2 * MiB, 1]
    assert exact["other_stream"] == [True, 4 * MiB, 2, 2]


@pytest.mark.subprocess
def test_record_stream_defers_reuse_until_the_stream_is_done(exact):
    assert exact["record_idle_stream_reused"] is True
    assert exact["pending_allocated"] == 0  # freed for the statistics at once
    assert exact["pending_not_reused"] is True
    assert exact["reused_after_stream_done"] is True


@pytest.mark.subprocess
def test_empty_cache_releases_everything_cached(exact):
    assert exact["empty_cache"] == [0, 0, 2, 4 * MiB, DEFAULT_CAPACITY]


@pytest.mark.subprocess
def test_segment_sizes_per_pool(exact):
    r = lambda n: (n + 511) // 512 * 512  # noqa: E731
    expected = {
        1: [512, 2 * MiB, 2 * MiB, 0],
        MiB: [MiB, 2 * MiB, 2 * MiB, 0],
        MiB + 1: [MiB + 512, 20 * MiB, 0, 20 * MiB],
        3 * MiB: [3 * MiB, 20 * MiB, 0, 20 * MiB],
        9 * MiB: [9 * MiB, 20 * MiB, 0, 20 * MiB],
        10 * MiB - 512: [10 * MiB - 512, 20 * MiB, 0, 20 * MiB],
        10 * MiB: [10 * MiB, 10 * MiB, 0, 10 * MiB],
        10 * MiB + 1: [r(10 * MiB + 1), 12 * MiB, 0, 12 * MiB],
        12 * MiB + 7: [r(12 * MiB + 7), 14 * MiB, 0, 14 * MiB],
        # The 1 MiB left is too small to split off in the large pool: the block is the segment.
        25 * MiB: [26 * MiB, 26 * MiB, 0, 26 * MiB],
    }
    assert exact["sizes"] == {str(k): v for k, v in expected.items()}


@pytest.mark.subprocess
def test_large_pool_segments_are_shared_and_released(exact):
    assert exact["large"] == [
        20 * MiB,  # 3 MiB and 5 MiB share one 20 MiB segment
        34 * MiB,  # 12 MiB + 1 does not fit the 12 MiB left: its own 14 MiB segment
        8 * MiB + 12 * MiB + 512,
        2,
        34 * MiB,  # freed, still cached
        20 * MiB,  # empty_cache released the 14 MiB segment
        20 * MiB,  # one live block keeps its segment
        0,
        34 * MiB,  # max_memory_reserved
        20 * MiB + 512,  # max_memory_allocated
    ]


@pytest.mark.subprocess
def test_split_blocks_merge_back(exact):
    assert exact["merge"] == [1, 2, 512 + 2 * MiB - 1024, 0, 0, 0]
    assert exact["halves"] == [1, 0, MiB]
    assert exact["end"] == [0, 0, 0]


# ------------------------------------------- stream-ordered memory lifetime

# Note [Stream-ordered memory]: queued kernels do not keep device memory
# alive; a freed block is reused by later work on its stream at once, and is
# unmapped only after the stream has passed the free. In a fresh process so
# the reused block is predictable, and so a kernel touching unmapped memory
# shows up as a crash of the script, not of the test run.
STREAM_ORDERED = script(
    "stream_ordered_memory",
    """
    import torch, torch_openreg
    dev = "openreg:0"
    n = 300_001  # more elements than an inline kernel takes: these queue
    stream = torch.openreg.current_stream()
    x = torch.ones(n, device=dev)
    torch.openreg.synchronize()
    R = RESULT

    # A result freed while the kernel writing it is queued: the next
    # allocation on the stream gets the block; stream order puts its writer
    # behind the first one.
    torch.openreg._sleep(300)
    y = x + 1
    p = y.data_ptr()
    del y
    z = torch.empty(n, device=dev)
    R["reused_while_queued"] = [z.data_ptr() == p, stream.query()]
    z.fill_(5)
    R["values"] = [z.min().item(), z.max().item()]

    # empty_cache while a queued kernel still writes freed memory: it waits
    # for the kernel instead of unmapping the memory under it.
    torch.openreg._sleep(300)
    w = x * 3
    del w, x, z
    t0 = time.perf_counter()
    torch.openreg.empty_cache()
    R["empty_cache"] = [time.perf_counter() - t0, stream.query(), torch.openreg.memory_reserved(0)]
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_freed_memory_is_reused_in_stream_order_while_kernels_are_queued():
    r = STREAM_ORDERED.result().check_ok()
    assert r["reused_while_queued"] == [True, False]
    assert r["values"] == [5.0, 5.0]


@pytest.mark.subprocess
def test_empty_cache_waits_for_queued_kernels_on_freed_memory():
    r = STREAM_ORDERED.result().check_ok()
    waited, idle, reserved = r["empty_cache"]
    assert waited >= 0.2 and idle and reserved == 0, r["empty_cache"]


# ------------------------------------------------------------- out of memory

OOM = script(
    "out_of_memory",
    """
    import torch, torch_openreg
    MiB = 1 << 20
    S = lambda d=0: dict(torch.accelerator.memory_stats(d))
    b = lambda n, device="openreg:0": torch.empty(n, dtype=torch.uint8, device=device)
    R = RESULT
    R["capacity"] = [list(torch.openreg.mem_get_info(0)), list(torch.openreg.mem_get_info(1)),
                     torch.openreg.options()["OPENREG_DEVICE_MEMORY"]["value"]]

    def oom(fn):
        try:
            fn()
        except torch.OutOfMemoryError as e:
            return ["OutOfMemoryError", str(e), isinstance(e, RuntimeError)]
        except BaseException as e:
            return [type(e).__name__, str(e), False]
        return None

    a = b(40 * MiB)
    R["oom"] = oom(lambda: b(30 * MiB))
    s = S()
    R["after_oom"] = [s["allocated_bytes.all.current"], s["reserved_bytes.all.current"], s["num_ooms"], s["num_alloc_retries"]]

    # The cache is emptied before giving up: 40 MiB cached + 50 MiB > 64 MiB.
    del a
    big = b(50 * MiB)
    s = S()
    R["retry"] = [s["allocated_bytes.all.current"], s["reserved_bytes.all.current"], s["num_ooms"],
                  s["num_alloc_retries"], s["num_device_free"]]
    ptr = big.data_ptr()
    del big

    # A block freed while another stream may still use it is waited for.
    side = torch.Stream(device="openreg:0")
    c = b(40 * MiB)
    pc = c.data_ptr()
    with torch.openreg.stream(side):
        torch.openreg._sleep(300)
    c.record_stream(side)
    del c
    t0 = time.perf_counter()
    d = b(40 * MiB)
    R["pending_wait_s"] = time.perf_counter() - t0
    s = S()
    R["pending"] = [d.data_ptr() == pc, s["num_sync_all_streams"], s["num_ooms"], s["allocated_bytes.all.current"]]
    del d

    # An op whose result does not fit: OutOfMemoryError, nothing leaks.
    x = torch.ones(5 * MiB, device="openreg:0")  # 20 MiB
    before = torch.openreg.memory_allocated(0)
    R["op_oom"] = oom(lambda: torch.cat([x, x, x, x]))
    R["op_oom_after"] = [torch.openreg.memory_allocated(0) - before, x.sum().item()]
    R["copy_oom"] = oom(lambda: torch.ones(17 * MiB).to("openreg:0"))
    del x

    # Device 1 names itself.
    R["oom_device1"] = oom(lambda: b(100 * MiB, "openreg:1"))

    # A memory fraction lowers the limit; restoring it lifts it.
    torch.openreg.set_per_process_memory_fraction(0.5, 1)
    R["fraction_oom"] = oom(lambda: b(40 * MiB, "openreg:1"))
    small = b(30 * MiB, "openreg:1")
    torch.openreg.set_per_process_memory_fraction(1.0, 1)
    more = b(30 * MiB, "openreg:1")
    R["fraction_restored"] = torch.openreg.memory_allocated(1)
    del small, more
    torch.openreg.empty_cache()
    R["end"] = [torch.openreg.memory_allocated(0), torch.openreg.memory_allocated(1),
                torch.openreg.memory_reserved(0), torch.openreg.memory_reserved(1)]
    done(RESULT)
    """,
    env=clean_env(OPENREG_DEVICE_MEMORY="64M"),
)


@pytest.fixture(scope="module")
def oom():
    return OOM.result().check_ok()


@pytest.mark.subprocess
def test_device_memory_option_sets_capacity(oom):
    assert oom["capacity"] == [[64 * MiB, 64 * MiB], [64 * MiB, 64 * MiB], str(64 * MiB)]


@pytest.mark.subprocess
def test_out_of_memory_error_names_device_request_and_usage(oom):
    kind, message, is_runtime_error = oom["oom"]
    assert kind == "OutOfMemoryError", message
    assert is_runtime_error
    assert "device 0" in message, message
    assert "30.00 MiB" in message and "31457280 bytes" in message, message
    assert "40.00 MiB is allocated" in message, message
    assert "40.00 MiB reserved" in message, message
    assert "24.00 MiB free" in message, message
    assert "64.00 MiB" in message, message
    # Nothing allocated by the failed request; one OOM, one retry.
    assert oom["after_oom"] == [40 * MiB, 40 * MiB, 1, 1]


@pytest.mark.subprocess
def test_out_of_memory_retries_after_releasing_the_cache(oom):
    assert oom["retry"] == [50 * MiB, 50 * MiB, 1, 2, 1]


@pytest.mark.subprocess
def test_out_of_memory_waits_for_pending_frees(oom):
    same_block, syncs, ooms, allocated_now = oom["pending"]
    assert same_block and syncs == 1 and ooms == 1 and allocated_now == 40 * MiB
    assert oom["pending_wait_s"] >= 0.15  # it waited for the side stream's sleep


@pytest.mark.subprocess
def test_ops_and_copies_that_do_not_fit_raise_and_leak_nothing(oom):
    kind, message, _ = oom["op_oom"]
    assert kind == "OutOfMemoryError", message
    assert "80.00 MiB" in message and "device 0" in message, message
    assert oom["op_oom_after"] == [0, 5 * MiB]
    kind, message, _ = oom["copy_oom"]
    assert kind == "OutOfMemoryError", message
    assert "68.00 MiB" in message, message


@pytest.mark.subprocess
def test_out_of_memory_on_device_1(oom):
    kind, message, _ = oom["oom_device1"]
    assert kind == "OutOfMemoryError", message
    assert "device 1" in message and "104857600 bytes" in message, message


@pytest.mark.subprocess
def test_memory_fraction_limits_and_restores(oom):
    kind, message, _ = oom["fraction_oom"]
    assert kind == "OutOfMemoryError", message
    assert "32.00 MiB usable" in message and "device 1" in message, message
    assert oom["fraction_restored"] == 60 * MiB
    assert oom["end"] == [0, 0, 0, 0]
