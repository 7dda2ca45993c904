# libtorch: the C++ library inside PyTorch's wheel, one version for CPU and
# GPU. cmake/TORCH_VERSION is the default (what the bootstrap installs and
# the GPU machines carry); any torch in cmake/TORCH_RANGE is accepted
# (cmake/TorchRange.cmake), anything else refused.
#
# Where it comes from, first match wins:
#   -DTorch_DIR=... or -DCMAKE_PREFIX_PATH=...   (your own torch install)
#   -DDFLASH_TORCH_PYTHON=/path/to/python        (its torch.utils.cmake_prefix_path)
#   $DFLASH_TORCH_ENV/bin/python                 (the environment ci/bootstrap.sh made)
#   ${XDG_CACHE_HOME:-~/.cache}/dflash/torch-<version>/bin/python
#   python3 on PATH

file(STRINGS ${PROJECT_SOURCE_DIR}/cmake/TORCH_VERSION DFLASH_TORCH_VERSION LIMIT_COUNT 1)

function(dflash_default_torch_python out)
  if(DEFINED ENV{DFLASH_TORCH_ENV})
    set(${out} "$ENV{DFLASH_TORCH_ENV}/bin/python" PARENT_SCOPE)
    return()
  endif()
  if(DEFINED ENV{XDG_CACHE_HOME})
    set(cache "$ENV{XDG_CACHE_HOME}")
  else()
    set(cache "$ENV{HOME}/.cache")
  endif()
  set(env_python "${cache}/dflash/torch-${DFLASH_TORCH_VERSION}/bin/python")
  if(EXISTS "${env_python}")
    set(${out} "${env_python}" PARENT_SCOPE)
  else()
    set(${out} python3 PARENT_SCOPE)
  endif()
endfunction()

if(NOT Torch_DIR)
  set(DFLASH_TORCH_PYTHON "" CACHE FILEPATH "Python whose torch package provides libtorch")
  if(NOT DFLASH_TORCH_PYTHON)
    dflash_default_torch_python(DFLASH_TORCH_PYTHON)
  endif()
  # Locates the package without importing it (importing torch takes seconds).
  execute_process(
    COMMAND "${DFLASH_TORCH_PYTHON}" -c
            "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
    OUTPUT_VARIABLE dflash_torch_pkg OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0 AND dflash_torch_pkg)
    list(PREPEND CMAKE_PREFIX_PATH "${dflash_torch_pkg}/share/cmake")
  endif()
endif()

# torch's CMake probes for GPUs to pick nvcc flags for its own macros (dflash
# uses CMAKE_CUDA_ARCHITECTURES, cmake/Cuda.cmake); naming Hopper skips that.
if(NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "dflash: libtorch ${DFLASH_TORCH_VERSION} not found (looked in the torch package of "
    "'${DFLASH_TORCH_PYTHON}' and CMAKE_PREFIX_PATH). Run ci/bootstrap.sh, which installs "
    "torch==${DFLASH_TORCH_VERSION} into its own environment, or pass "
    "-DDFLASH_TORCH_PYTHON=<python with torch ${DFLASH_TORCH_VERSION}> (docs/BUILDING.md).")
endif()
set(DFLASH_TORCH_DEFAULT "${DFLASH_TORCH_VERSION}")
include(${CMAKE_CURRENT_LIST_DIR}/TorchRange.cmake)
dflash_check_torch_version("${Torch_VERSION}" " at ${Torch_DIR}")
# From here on, the version found (the default or another in the range).
set(DFLASH_TORCH_VERSION "${Torch_VERSION}")
# dflash is C++17; a libtorch whose headers require C++20 (ATen.h says so:
# torch 2.15 does, 2.11 does not) makes the whole tree C++20 (docs/BUILDING.md).
get_target_property(dflash_torch_inc torch INTERFACE_INCLUDE_DIRECTORIES)
foreach(dir ${dflash_torch_inc})
  if(EXISTS "${dir}/ATen/ATen.h")
    file(READ "${dir}/ATen/ATen.h" dflash_aten_h)
    if(dflash_aten_h MATCHES "C\\+\\+20 or later")
      set(CMAKE_CXX_STANDARD 20)  # the .cu units include no torch header: CUDA stays 17
      message(STATUS "dflash: libtorch ${Torch_VERSION} requires C++20: building as C++20")
    endif()
    # Autograd nodes: std::shared_ptr with torch::autograd::deleteNode up to
    # some release, c10::intrusive_ptr after (torch 2.15); checkpoint.cpp
    # creates one either way.
    file(READ "${dir}/torch/csrc/autograd/function.h" dflash_function_h)
    if(dflash_function_h MATCHES "void deleteNode\\(")
      set(DFLASH_TORCH_SHARED_NODES ON)
    endif()
    break()
  endif()
endforeach()
get_filename_component(DFLASH_TORCH_ROOT "${Torch_DIR}/../../.." ABSOLUTE)
message(STATUS "dflash: libtorch ${Torch_VERSION} from ${DFLASH_TORCH_ROOT}")

# What dflash links: torch (CPU and, when the wheel has it, CUDA kernels; the
# --no-as-needed wrapper keeps libtorch_cuda loaded so its kernels register)
# and c10. Deliberately not ${TORCH_LIBRARIES}: torch's CMake appends the
# CUDA driver stub (libcuda.so) and nvrtc, and a binary that needs
# libcuda.so.1 does not start on a machine without the NVIDIA driver.
#
# libtorch_cuda is not linked: dflash uses none of its (or libc10_cuda's)
# symbols; it needs only what its static initializers register (CUDA
# kernels, hooks, NCCL), and loading it eagerly cost every command ~235 MB
# of RSS and ~0.4 s (issue 14). load_torch_cuda() (core/env.h) dlopens it
# from libtorch_cpu's directory when CUDA is wanted. The `torch` target
# still supplies the include directories and compile options.
add_library(dflash_torch INTERFACE)
target_link_libraries(dflash_torch INTERFACE torch_cpu_library c10)
target_include_directories(dflash_torch INTERFACE
                           $<TARGET_PROPERTY:torch,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_options(dflash_torch INTERFACE $<TARGET_PROPERTY:torch,INTERFACE_COMPILE_OPTIONS>)
if(TARGET c10_cuda)
  set(DFLASH_TORCH_HAS_CUDA ON)
else()
  set(DFLASH_TORCH_HAS_CUDA OFF)
endif()
# c10d's headers compile only the backends the including code asks for.
target_compile_definitions(dflash_torch INTERFACE USE_C10D_GLOO
                           $<$<BOOL:${DFLASH_TORCH_HAS_CUDA}>:USE_C10D_NCCL>)

# The wheel ships its own fmt headers (a newer fmt than Debian's libfmt);
# an include directory that holds only Debian's fmt goes first, so that
# dflash compiles against the headers of the libfmt it links.
get_target_property(dflash_fmt_inc fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
list(GET dflash_fmt_inc 0 dflash_fmt_inc)
set(DFLASH_FMT_FIRST "${CMAKE_BINARY_DIR}/include-first")
file(MAKE_DIRECTORY "${DFLASH_FMT_FIRST}")
file(CREATE_LINK "${dflash_fmt_inc}/fmt" "${DFLASH_FMT_FIRST}/fmt" SYMBOLIC)
target_include_directories(dflash_torch BEFORE INTERFACE "${DFLASH_FMT_FIRST}")
# What this libtorch's headers offer, as a header (not a -D flag: the flags of
# every target, and so the precompiled header and ccache, stay the same).
if(DFLASH_TORCH_SHARED_NODES)
  set(dflash_shared_nodes 1)
else()
  set(dflash_shared_nodes 0)
endif()
file(CONFIGURE OUTPUT "${DFLASH_FMT_FIRST}/dflash_torch_features.h" CONTENT
     "// Generated by cmake/Torch.cmake for libtorch ${Torch_VERSION}.\n#pragma once\n#define DFLASH_TORCH_SHARED_NODES ${dflash_shared_nodes}\n")

# The wheel's libtorch.so carries (and exports) parts of a newer libstdc++
# than the system's, std::filesystem among them; when libtorch.so comes
# before libstdc++.so.6 in a binary's DT_NEEDED list, the dynamic linker
# binds dflash's std::filesystem calls to those copies, which crash
# (std::filesystem::remove_all jumps to 0). Naming libstdc++ first, before
# any object or library, makes the system's definitions win.
target_link_options(dflash_torch INTERFACE
                    "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
