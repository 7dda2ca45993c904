# Sanitizer and fuzzing builds (docs/RELIABILITY.md).
#   -DDFLASH_SANITIZE=address,undefined  the whole tree under ASan + UBSan
#                                        (LeakSanitizer comes with ASan)
#   -DDFLASH_FUZZ=ON                     clang only: the libFuzzer targets in
#                                        fuzz/, with address,undefined
# Both build against the same libtorch; libtorch itself is not instrumented,
# and its reports are suppressed in ci/sanitizers/ (one comment each).

set(DFLASH_SANITIZE "" CACHE STRING "Sanitizers for every dflash target, e.g. address,undefined")
option(DFLASH_FUZZ "Build the libFuzzer targets in fuzz/ (clang)" OFF)

if(DFLASH_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DFLASH_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ (ci/fuzz.sh does)")
  endif()
  if(NOT DFLASH_SANITIZE)
    set(DFLASH_SANITIZE "address,undefined")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()

if(DFLASH_SANITIZE)
  message(STATUS "dflash: sanitizers ${DFLASH_SANITIZE}")
  # Every finding aborts (UBSan otherwise prints and continues); frame
  # pointers and line tables make the reports readable.
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DFLASH_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer;-g1>")
  add_link_options(-fsanitize=${DFLASH_SANITIZE})
endif()
