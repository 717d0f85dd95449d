# Writes torch_openreg's CMake package into the Python package, so that a
# libtorch program can find_package(torch_openreg) from a pip install:
#
#   cmake -DPACKAGE_DIR=<the torch_openreg package being built>
#         -DTORCH_ROOT=<torch package dir> -DTORCH_CXX11_ABI=<0|1>
#         -P cmake/PythonPackageConfig.cmake
#
# Run by setup.py (build_py). The package directory is the package's install
# prefix: lib/libtorch_openreg.so and include/ are already there, and this
# adds share/cmake/torch_openreg/ (the config, its version file and the two
# modules it includes). torch_openreg.cmake_prefix_path names
# <package>/share/cmake, as torch.utils.cmake_prefix_path names torch's.
# The same template as CMakeLists.txt's installed package, with paths
# relative to the config file, so the package may move.

cmake_minimum_required(VERSION 3.24)

foreach(var PACKAGE_DIR TORCH_ROOT TORCH_CXX11_ABI)
  if("${${var}}" STREQUAL "")
    message(FATAL_ERROR "PythonPackageConfig.cmake: pass -D${var}=...")
  endif()
endforeach()

set(source_dir "${CMAKE_CURRENT_LIST_DIR}/..")
# One version for the crate and the CMake package: Cargo.toml's.
file(STRINGS "${source_dir}/Cargo.toml" version_line REGEX "^version *= *\"[0-9.]+\"" LIMIT_COUNT 1)
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" version "${version_line}")

include(CMakePackageConfigHelpers)

set(package_dir "share/cmake/torch_openreg")
# The template's values (see CMakeLists.txt): where things are, relative to
# the prefix, and the torch the library was built against.
set(OPENREG_CONFIG_MODULE_DIR "${package_dir}")
set(OPENREG_CONFIG_LIBRARY "lib/libtorch_openreg.so")
set(OPENREG_CONFIG_INCLUDE_DIR "include")
set(OPENREG_TORCH_ROOT "${TORCH_ROOT}")
set(OPENREG_TORCH_ABI "${TORCH_CXX11_ABI}")

configure_package_config_file("${source_dir}/cmake/torch_openregConfig.cmake.in"
  "${PACKAGE_DIR}/${package_dir}/torch_openregConfig.cmake"
  INSTALL_DESTINATION "${package_dir}"
  INSTALL_PREFIX "${PACKAGE_DIR}"
  PATH_VARS OPENREG_CONFIG_MODULE_DIR OPENREG_CONFIG_LIBRARY OPENREG_CONFIG_INCLUDE_DIR)
write_basic_package_version_file("${PACKAGE_DIR}/${package_dir}/torch_openregConfigVersion.cmake"
  VERSION "${version}" COMPATIBILITY SameMinorVersion)
file(COPY "${source_dir}/cmake/OpenRegTorch.cmake" "${source_dir}/cmake/OpenRegLibrary.cmake"
  DESTINATION "${PACKAGE_DIR}/${package_dir}")
