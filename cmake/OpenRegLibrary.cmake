# Defines torch_openreg::torch_openreg, the one target a libtorch program
# links to use openreg devices: libtorch_openreg.so, the public headers
# (include/openreg.h and friends) and torch.
#
#   openreg_define_library_target(LIBRARY <path to libtorch_openreg.so>
#                                 INCLUDE_DIR <dir> CXX11_ABI <0|1>
#                                 [BUILT_BY <target>])
#
# BUILT_BY (in this project's own build) names the target that builds the
# library, so that whatever links it waits for it; without it (the installed
# package) the target is an imported one.
#
# Note [Linking a library nobody references]: a program written only against
# PyTorch's API (c10::Device("openreg:1"), c10::DeviceGuard, ...) references
# no symbol of libtorch_openreg.so; the backend registers itself from the
# library's load-time constructor. A linker running with --as-needed (the
# default on Ubuntu and others) would drop such a library's DT_NEEDED entry,
# the library would never load, and "openreg" would be an unknown device. So
# the library is linked through the OPENREG_NO_AS_NEEDED link feature, which
# wraps just this one library in --push-state,--no-as-needed ... --pop-state
# and leaves the rest of the program's link line alone.

include_guard(GLOBAL)

# Cache (not normal) variables: the feature must be visible wherever a target
# that links torch_openreg is generated, whatever scope found the package.
set(CMAKE_LINK_LIBRARY_USING_OPENREG_NO_AS_NEEDED
  "LINKER:--push-state,--no-as-needed" "<LINK_ITEM>" "LINKER:--pop-state"
  CACHE INTERNAL "Links one shared library even if nothing references it")
set(CMAKE_LINK_LIBRARY_USING_OPENREG_NO_AS_NEEDED_SUPPORTED TRUE CACHE INTERNAL "")

function(openreg_define_library_target)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "LIBRARY;INCLUDE_DIR;CXX11_ABI;BUILT_BY" "")

  add_library(torch_openreg::library SHARED IMPORTED)
  # Cargo gives the cdylib no SONAME. Linked by full path, the DT_NEEDED entry
  # would then be that absolute path; with IMPORTED_NO_SONAME CMake links it
  # as -ltorch_openreg and the entry is plain "libtorch_openreg.so", found
  # through the program's RUNPATH.
  set_target_properties(torch_openreg::library PROPERTIES
    IMPORTED_LOCATION "${ARG_LIBRARY}"
    IMPORTED_NO_SONAME TRUE)

  if(ARG_BUILT_BY)
    add_library(torch_openreg INTERFACE)
    add_dependencies(torch_openreg ${ARG_BUILT_BY})
    add_library(torch_openreg::torch_openreg ALIAS torch_openreg)
    set(target torch_openreg)
  else()
    add_library(torch_openreg::torch_openreg INTERFACE IMPORTED)
    set(target torch_openreg::torch_openreg)
  endif()
  set_target_properties(${target} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${ARG_INCLUDE_DIR}"
    # TorchConfig.cmake's own targets do not carry the ABI define.
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${ARG_CXX11_ABI}"
    INTERFACE_LINK_LIBRARIES "$<LINK_LIBRARY:OPENREG_NO_AS_NEEDED,torch_openreg::library>;torch")
endfunction()
