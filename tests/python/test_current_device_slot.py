"""The current device lives in one initial-exec thread-local slot of the C++
shim (Note [Current device slot] in cpp/device/current_device.h): the device
guard reads and writes it inline, Rust through its accessors. These tests load
the library late, as Python does, while threads already run, and check every
thread's slot through both ways in."""

import struct

import pytest

from _openreg_util import clean_env, script

# The library is loaded after the process started (autoload off, so `import
# torch` does not load it): the loader must give the slot (the library's
# static TLS block) to every thread, those that existed before the load
# included. Each thread then moves its device through the guard (C++, inline)
# and through the runtime (Rust, the accessors) and reads it back both ways.
LATE_LOAD_WITH_THREADS = script(
    "late_load_with_threads",
    """
    import importlib.util, threading
    import torch
    RESULT["loaded_before_import"] = "libtorch_openreg" in open("/proc/self/maps").read()
    spec = importlib.util.find_spec("torch_openreg")
    RESULT["library"] = os.path.join(spec.submodule_search_locations[0], "lib", "libtorch_openreg.so")

    def exercise(i, out):
        both = lambda: [torch.openreg.current_device(), torch.accelerator.current_device_index()]
        seen = {"start": both()}
        mine = i % 2
        for _ in range(200):
            torch.openreg.set_device(mine)  # the runtime (Rust) writes the slot
            a = both()
            with torch.accelerator.device_index(1 - mine):  # the guard (C++) exchanges it
                b = both()
                c = torch.empty(1, device="openreg").device.index
            d = both()
            torch.accelerator.set_device_index(1 - mine)
            e = torch.openreg.current_device()
            if (a, b, c, d, e) != ([mine] * 2, [1 - mine] * 2, 1 - mine, [mine] * 2, 1 - mine):
                seen["wrong"] = [a, b, c, d, e]
                break
        seen["end"] = both()
        out[i] = seen

    go = threading.Event()
    early = {}
    def early_thread(i):
        go.wait()
        exercise(i, early)
    threads = [threading.Thread(target=early_thread, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    import torch_openreg  # dlopen, with six threads alive
    RESULT["loaded_after_import"] = "libtorch_openreg" in open("/proc/self/maps").read()
    go.set()
    late = {}
    late_threads = [threading.Thread(target=exercise, args=(i, late)) for i in range(4)]
    for t in late_threads:
        t.start()
    for t in threads + late_threads:
        t.join(60)
    RESULT["early"] = early
    RESULT["late"] = late
    RESULT["main"] = [torch.openreg.current_device(), torch.accelerator.current_device_index()]
    done(RESULT)
    """,
    env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
)


def _static_tls_flag(path: str) -> tuple[bool, int]:
    """(DF_STATIC_TLS set, size of the TLS segment) of an ELF64 shared library."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not an ELF64 file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    flags, tls_size = 0, 0
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 7:  # PT_TLS
            tls_size = p_memsz
        if p_type == 2:  # PT_DYNAMIC
            for off in range(p_offset, p_offset + p_filesz, 16):
                tag, value = struct.unpack_from("<qQ", data, off)
                if tag == 30:  # DT_FLAGS
                    flags = value
    return bool(flags & 0x10), tls_size  # DF_STATIC_TLS


@pytest.mark.subprocess
def test_a_late_loaded_library_gives_each_thread_its_own_slot():
    r = LATE_LOAD_WITH_THREADS.result().check_ok()
    assert r["loaded_before_import"] is False and r["loaded_after_import"] is True
    # What this test is about: the slot is initial-exec TLS, which makes the
    # library DF_STATIC_TLS (else it would not test the late load of one).
    static_tls, tls_size = _static_tls_flag(r["library"])
    assert static_tls, "the library has no initial-exec TLS: Note [Current device slot]"
    assert 0 < tls_size <= 1024, f"the library's static TLS block grew to {tls_size} bytes"
    for group, count in (("early", 6), ("late", 4)):
        threads = r[group]
        assert len(threads) == count, (group, threads)
        for i, seen in threads.items():
            mine = int(i) % 2
            # Every thread starts on device 0, whether it existed before the
            # load or not, and ends where it set itself.
            assert seen["start"] == [0, 0], (group, i, seen)
            assert "wrong" not in seen, (group, i, seen)
            assert seen["end"] == [1 - mine] * 2, (group, i, seen)
    assert r["main"] == [0, 0]  # the threads' moves did not touch the main thread's slot
