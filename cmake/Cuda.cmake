# CUDA in the build: nvcc compiles dflash's .cu translation units (sm_90,
# Hopper, by default; -DCMAKE_CUDA_ARCHITECTURES=... overrides). They use the
# CUDA runtime only, which loads the driver lazily: every binary still starts
# and runs the CPU suite on a machine without the NVIDIA driver.
#
# DFLASH_CUDA=OFF builds without nvcc (the .cu units are left out and
# `dflash env` reports a build without CUDA); ON requires nvcc and a CUDA
# libtorch. The default is ON when both are present.

include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER AND DFLASH_TORCH_HAS_CUDA)
  set(dflash_cuda_default ON)
else()
  set(dflash_cuda_default OFF)
endif()
option(DFLASH_CUDA "Compile dflash's CUDA translation units" ${dflash_cuda_default})

if(DFLASH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "dflash: DFLASH_CUDA=ON but no nvcc was found (set CUDACXX or "
                        "CMAKE_CUDA_COMPILER, or configure with -DDFLASH_CUDA=OFF)")
  endif()
  if(NOT DFLASH_TORCH_HAS_CUDA)
    message(FATAL_ERROR "dflash: DFLASH_CUDA=ON but libtorch at ${DFLASH_TORCH_ROOT} has no "
                        "CUDA (c10_cuda missing); install the CUDA build of torch "
                        "${DFLASH_TORCH_VERSION} or configure with -DDFLASH_CUDA=OFF")
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # The shared runtime, like libtorch's: one CUDA runtime in the process.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  if(DFLASH_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER "${DFLASH_CCACHE}")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "dflash: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
