//! Builds the C++ shim against the installed PyTorch and links the library.
//!
//! Torch is found by `OPENREG_TORCH_DIR` (the `torch` package directory, with
//! `include/` and `lib/`; then `OPENREG_TORCH_CXX11_ABI` gives the ABI flag,
//! default 1) or else by asking `$PYTHON` (default `python3`).

use std::path::PathBuf;
use std::process::Command;

struct Torch {
    dir: PathBuf,
    cxx11_abi: String,
}

fn find_torch() -> Torch {
    if let Ok(dir) = std::env::var("OPENREG_TORCH_DIR") {
        let cxx11_abi = std::env::var("OPENREG_TORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
        return Torch {
            dir: dir.into(),
            cxx11_abi,
        };
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))";
    // Without autoload: an installed torch_openreg (this very library, maybe
    // mid-rebuild) must not be loaded to find the torch it builds against.
    let output = Command::new(&python)
        .args(["-c", script])
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output();
    match output {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let mut lines = text.lines().filter(|l| !l.is_empty());
            match (lines.next(), lines.next()) {
                (Some(dir), Some(abi)) => Torch {
                    dir: dir.trim().into(),
                    cxx11_abi: abi.trim().into(),
                },
                _ => fail(&format!("`{python}` printed no torch location: {text}")),
            }
        }
        Ok(out) => fail(&format!(
            "`{python} -c 'import torch'` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => fail(&format!("cannot run `{python}`: {e}")),
    }
}

fn fail(why: &str) -> ! {
    panic!(
        "torch_openreg needs PyTorch 2.15 to build: {why}\n\
         Fix one of:\n  - install it: python3 -m pip install 'torch==2.15.*'\n  \
         - point PYTHON at an interpreter that has it\n  \
         - set OPENREG_TORCH_DIR to the torch package directory (and OPENREG_TORCH_CXX11_ABI)"
    )
}

fn main() {
    let torch = find_torch();
    let include = torch.dir.join("include");
    let lib = torch.dir.join("lib");
    if !include.join("c10").is_dir() {
        fail(&format!("{} has no include/c10", torch.dir.display()));
    }

    let sources = [
        "cpp/device/guard.cpp",
        "cpp/device/current_device.cpp",
        "cpp/device/hooks.cpp",
        "cpp/register.cpp",
        "cpp/device/allocator.cpp",
        "cpp/device/device_memory.cpp",
        "cpp/ops/ops.cpp",
        "cpp/ops/fallback.cpp",
        "cpp/ops/sparse_kernels.cpp",
        "cpp/ops/half_precision_fft.cpp",
        "cpp/ops/nansum.cpp",
        "cpp/ops/scatter_reduce.cpp",
        "cpp/ops/scaled_mm.cpp",
        "cpp/ops/device_named_ops.cpp",
        "cpp/ops/deterministic_alerts.cpp",
        "cpp/ops/kernel_split.cpp",
        "cpp/ops/dtype_policy.cpp",
        "cpp/ops/meta_results.cpp",
        "cpp/ops/meta_kernels.cpp",
        "cpp/ops/convolution.cpp",
        "cpp/ops/batch_norm.cpp",
        "cpp/ops/max_pool.cpp",
        "cpp/ops/elementwise.cpp",
        "cpp/ops/result_format.cpp",
        "cpp/random/generator.cpp",
        "cpp/random/random.cpp",
        "cpp/frontends/autocast.cpp",
        "cpp/frontends/attention.cpp",
        "cpp/frontends/math_attention.cpp",
        "cpp/frontends/flash_efficient_attention.cpp",
        "cpp/ops/accelerator_ops.cpp",
        "cpp/graphs/graph.cpp",
        "cpp/graphs/graph_kernels.cpp",
        "cpp/frontends/profiler.cpp",
        "cpp/frontends/profiler_stubs.cpp",
    ];
    cxx_build::bridge("src/bridge/ffi.rs")
        .files(sources)
        .std("c++20")
        .include(&include)
        .include(include.join("kineto")) // cpp/frontends/profiler.cpp
        .define("_GLIBCXX_USE_CXX11_ABI", torch.cxx11_abi.as_str())
        // As the wheel itself and every extension setuptools builds are
        // compiled: torch's TORCH_INTERNAL_ASSERT_DEBUG_ONLY checks are off.
        // (With them on, each c10::Device made costs an out-of-line call:
        // two per device-guard round trip, Note [Current device slot].)
        .define("NDEBUG", None)
        // As PyTorch compiles itself: torch's headers include the per-operator
        // headers they need (ATen/ops/NAME.h), not ATen/Functions.h and with
        // it every operator (100K-150K of a translation unit's 350K lines).
        // The shim's own files do the same (cpp/README.md, Thin includes).
        .define("AT_PER_OPERATOR_HEADERS", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-function")
        // GCC 12 misreads c10::List<std::optional<at::Tensor>> (torch's own
        // headers) as writing past an object; a known false positive.
        .flag_if_supported("-Wno-stringop-overflow")
        .compile("torch_openreg_shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    for name in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-lib=dylib=stdc++");
    // Calls from the C++ shim into the bridge's exported Rust functions bind
    // inside the library (no PLT hop) — they are on the device-guard hot path.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");

    for path in sources.iter().chain(&[
        "cpp/shim.h",
        "cpp/checked.h",
        "cpp/backend.h",
        "cpp/device/device_memory.h",
        "cpp/ops/meta_results.h",
        "cpp/ops/meta_kernels.h",
        "cpp/generated/meta_kernels_table.h",
        "cpp/ops/dtype_policy.h",
        "cpp/generated/dtype_table.h",
        "cpp/ops/ivalue_tensors.h",
        "cpp/ops/result_format.h",
        "cpp/random/generator.h",
        "cpp/graphs/graph_kernels.h",
        "cpp/device/memory_generation.h",
        "cpp/device/current_device.h",
        "src/bridge/ffi.rs",
    ]) {
        println!("cargo:rerun-if-changed={path}");
    }
    for var in ["OPENREG_TORCH_DIR", "OPENREG_TORCH_CXX11_ABI", "PYTHON"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
}
