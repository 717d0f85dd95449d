# Locates the installed PyTorch and makes its C++ libraries available as the
# imported targets `c10`, `torch_cpu` and `torch` — the names TorchConfig.cmake
# defines, so code written against either works unchanged.
#
# Used by this project's CMakeLists.txt and by the installed
# torch_openregConfig.cmake, so an application finds torch exactly the way the
# library was built against it.
#
#   openreg_find_torch([DEFAULT_DIR <dir>] [DEFAULT_CXX11_ABI <0|1>])
#
# A macro, because find_package(Torch) enables the CUDA language, which CMake
# allows only at file scope; call it at file scope.
#
# Where torch is (first match wins):
#   1. the cache variable OPENREG_TORCH_DIR, or the variable TORCH_DIR, or the
#      environment variable OPENREG_TORCH_DIR (what build.rs reads): the
#      `torch` package directory, the one holding include/ and lib/;
#   2. DEFAULT_DIR, if it holds torch (the installed package passes the torch
#      the library was built against);
#   3. asking Python: Python3_EXECUTABLE if set, else $PYTHON, else python3
#      (the last two as build.rs does).
# Which C++ ABI it uses (_GLIBCXX_USE_CXX11_ABI), never hard-coded: the cache
# variable OPENREG_TORCH_CXX11_ABI if set, else
# torch._C._GLIBCXX_USE_CXX11_ABI when Python located torch, else
# DEFAULT_CXX11_ABI with DEFAULT_DIR, else read off libc10.so's exported
# symbols (`[abi:cxx11]` names exist only in new-ABI builds).
#
# Sets OPENREG_TORCH_ROOT (the torch directory), OPENREG_TORCH_ABI (0 or 1)
# and OPENREG_TORCH_PYTHON (the interpreter that located torch, or empty).
#
# find_package(Torch) is used only where it can work: the CUDA wheel's
# Caffe2Config.cmake stops with FATAL_ERROR — which no caller can catch —
# unless a CUDA compiler and toolkit are installed. OPENREG_TORCH_CMAKE_CONFIG
# picks: AUTO (default: for a CPU-only torch, or when a CUDA compiler is
# found), ON (always) or OFF (never: define the targets here).

include_guard(GLOBAL)

set(OPENREG_TORCH_DIR "" CACHE PATH "The torch package directory (with include/ and lib/); empty: ask Python")
set(OPENREG_TORCH_CXX11_ABI "" CACHE STRING "torch's _GLIBCXX_USE_CXX11_ABI (0 or 1); empty: detect")
set(OPENREG_TORCH_CMAKE_CONFIG AUTO CACHE STRING
  "Load torch's own TorchConfig.cmake: AUTO (only where it can work), ON or OFF")
set_property(CACHE OPENREG_TORCH_CMAKE_CONFIG PROPERTY STRINGS AUTO ON OFF)

macro(openreg_find_torch)
  _openreg_locate_torch(${ARGN})
  if(TARGET torch)
    message(STATUS "openreg: using the torch targets already defined")
  elseif(_openreg_use_torch_config)
    message(STATUS "openreg: loading ${OPENREG_TORCH_ROOT}/share/cmake/Torch/TorchConfig.cmake "
                   "(if that fails, configure with -DOPENREG_TORCH_CMAKE_CONFIG=OFF)")
    find_package(Torch REQUIRED CONFIG PATHS "${OPENREG_TORCH_ROOT}/share/cmake/Torch" NO_DEFAULT_PATH)
  else()
    message(STATUS "openreg: torch at ${OPENREG_TORCH_ROOT} (C++11 ABI ${OPENREG_TORCH_ABI}); "
                   "defining its targets from include/ and lib/")
    _openreg_define_torch_targets("${OPENREG_TORCH_ROOT}" "${OPENREG_TORCH_ABI}")
  endif()
  unset(_openreg_use_torch_config)
endmacro()

function(_openreg_locate_torch)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "DEFAULT_DIR;DEFAULT_CXX11_ABI" "")
  set(abi "")
  set(python "")
  if(OPENREG_TORCH_DIR)
    set(dir "${OPENREG_TORCH_DIR}")
  elseif(TORCH_DIR)
    set(dir "${TORCH_DIR}")
  elseif(NOT "$ENV{OPENREG_TORCH_DIR}" STREQUAL "")
    set(dir "$ENV{OPENREG_TORCH_DIR}")
  elseif(ARG_DEFAULT_DIR AND EXISTS "${ARG_DEFAULT_DIR}/include/c10")
    set(dir "${ARG_DEFAULT_DIR}")
    set(abi "${ARG_DEFAULT_CXX11_ABI}")
  else()
    _openreg_torch_from_python(dir abi python)
  endif()
  if(NOT dir OR NOT EXISTS "${dir}/include/c10")
    message(FATAL_ERROR
      "openreg needs PyTorch 2.15 (the torch package's include/ and lib/), but found none "
      "(looked at: '${dir}').\nFix one of:\n"
      "  - install it: python3 -m pip install 'torch==2.15.*'\n"
      "  - point the PYTHON environment variable at an interpreter that has it\n"
      "  - configure with -DOPENREG_TORCH_DIR=<site-packages>/torch")
  endif()
  if(NOT OPENREG_TORCH_CXX11_ABI STREQUAL "")
    set(abi "${OPENREG_TORCH_CXX11_ABI}")
  elseif(abi STREQUAL "")
    _openreg_abi_from_library("${dir}" abi)
  endif()
  _openreg_torch_config_usable("${dir}" use_config)

  set(OPENREG_TORCH_ROOT "${dir}" PARENT_SCOPE)
  set(OPENREG_TORCH_ABI "${abi}" PARENT_SCOPE)
  set(OPENREG_TORCH_PYTHON "${python}" PARENT_SCOPE)
  set(_openreg_use_torch_config "${use_config}" PARENT_SCOPE)
endfunction()

function(_openreg_torch_from_python out_dir out_abi out_python)
  if(Python3_EXECUTABLE)
    set(python "${Python3_EXECUTABLE}")
  elseif(NOT "$ENV{PYTHON}" STREQUAL "")
    set(python "$ENV{PYTHON}")
  else()
    find_program(OPENREG_PYTHON3 python3)
    set(python "${OPENREG_PYTHON3}")
  endif()
  set(${out_dir} "" PARENT_SCOPE)
  if(NOT python)
    return()
  endif()
  # The three answers go last: `import torch` may print warnings first.
  execute_process(
    COMMAND "${python}" -c
      "import os, sys, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(sys.executable)"
    OUTPUT_VARIABLE output
    ERROR_VARIABLE error
    RESULT_VARIABLE status
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0)
    message(STATUS "openreg: `${python} -c 'import torch'` failed: ${error}")
    return()
  endif()
  string(REPLACE "\n" ";" lines "${output}")
  list(LENGTH lines count)
  math(EXPR first "${count} - 3")
  list(SUBLIST lines ${first} 3 answers)
  list(GET answers 0 dir)
  list(GET answers 1 abi)
  list(GET answers 2 executable)
  set(${out_dir} "${dir}" PARENT_SCOPE)
  set(${out_abi} "${abi}" PARENT_SCOPE)
  set(${out_python} "${executable}" PARENT_SCOPE)
endfunction()

function(_openreg_abi_from_library dir out_abi)
  file(STRINGS "${dir}/lib/libc10.so" new_abi_names REGEX "B5cxx11" LIMIT_COUNT 1)
  if(new_abi_names)
    set(${out_abi} 1 PARENT_SCOPE)
  else()
    set(${out_abi} 0 PARENT_SCOPE)
  endif()
endfunction()

# Whether this torch's TorchConfig.cmake can be loaded here (see the top).
function(_openreg_torch_config_usable dir out)
  set(${out} FALSE PARENT_SCOPE)
  if(OPENREG_TORCH_CMAKE_CONFIG STREQUAL "ON")
    set(${out} TRUE PARENT_SCOPE)
  elseif(OPENREG_TORCH_CMAKE_CONFIG STREQUAL "OFF"
         OR NOT EXISTS "${dir}/share/cmake/Torch/TorchConfig.cmake")
    return()
  elseif(EXISTS "${dir}/version.py")
    # A wheel records its CUDA version in version.py; `None` means CPU-only,
    # and then the config needs no CUDA.
    file(STRINGS "${dir}/version.py" cuda_line REGEX "^cuda[: ]")
    if(cuda_line MATCHES "None")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# The imported targets TorchConfig.cmake would define, from include/ and lib/.
# `torch` is libtorch.so, which in a CUDA wheel also loads libtorch_cuda.so,
# as it does with the real config.
function(_openreg_define_torch_targets dir abi)
  foreach(name c10 torch_cpu torch)
    if(NOT EXISTS "${dir}/lib/lib${name}.so")
      message(FATAL_ERROR "openreg: ${dir}/lib/lib${name}.so is missing; is ${dir} a torch installation?")
    endif()
    add_library(${name} SHARED IMPORTED)
    set_target_properties(${name} PROPERTIES
      IMPORTED_LOCATION "${dir}/lib/lib${name}.so"
      IMPORTED_SONAME "lib${name}.so"
      INTERFACE_INCLUDE_DIRECTORIES "${dir}/include"
      INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${abi}"
      INTERFACE_COMPILE_FEATURES cxx_std_20)
  endforeach()
  set_target_properties(torch_cpu PROPERTIES INTERFACE_LINK_LIBRARIES c10)
  set_target_properties(torch PROPERTIES
    INTERFACE_LINK_LIBRARIES "torch_cpu;c10"
    INTERFACE_INCLUDE_DIRECTORIES "${dir}/include;${dir}/include/torch/csrc/api/include")
endfunction()
