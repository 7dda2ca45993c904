# Compile-time hygiene: ccache, lld, warnings, and one precompiled header that
# every dflash target reuses (a TU with <ATen/ATen.h> costs ~5 s with it).

find_program(DFLASH_CCACHE ccache)
if(DFLASH_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # Precompiled headers are only cacheable with this sloppiness. Paths are
  # hashed relative to the clone (base_dir); measured: a second clone in
  # another folder still misses on every TU that uses the precompiled header
  # (its .gch differs), so a fresh clone builds in full (~6 min here).
  set(CMAKE_CXX_COMPILER_LAUNCHER
      "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_BASEDIR=${PROJECT_SOURCE_DIR};${DFLASH_CCACHE}")
endif()

include(CheckLinkerFlag)
check_linker_flag(CXX "-fuse-ld=lld" DFLASH_HAVE_LLD)
if(DFLASH_HAVE_LLD)
  add_link_options("-fuse-ld=lld")
endif()

# Every object is position-independent (-fPIC), executables included: the
# static libraries also link into the PyTorch op library (ops/, a shared
# object), and one precompiled header serves all targets only when every
# target compiles with the same -fpic setting (gcc checks it). Executables
# were -fPIE before (Debian's gcc default). Not measured side by side; after
# the change `dflash bench` meets every target of docs/PERFORMANCE.md
# (its "The PyTorch op" section has the figures).
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fPIC> $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fPIC>)

# Applied to every dflash target so the precompiled header stays reusable
# (gcc rejects a PCH built with different flags).
function(dflash_setup_target tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wno-unused-parameter -Winvalid-pch)
  target_include_directories(${tgt} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# A dflash library: sources, its dependencies, and the shared PCH.
function(dflash_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  dflash_setup_target(${name})
  target_link_libraries(${name} PUBLIC ${A_DEPS} dflash_torch)
  target_precompile_headers(${name} REUSE_FROM dflash_pch)
endfunction()
