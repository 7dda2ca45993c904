# One loop registers every test: each `<area>/<name>_test.cpp` beside the code
# it covers becomes an executable whose GoogleTest cases ctest lists one by one.
# Files named `*_nightly_test.cpp` form the nightly suite (label `nightly`);
# everything else is the quick suite (label `quick`).

# ctest -j runs several tests at once on few cores, each with libtorch's
# OpenMP pool of one thread per core: with libgomp's default (spinning)
# wait policy, the idle threads of one test burn the cores another needs
# (two `dflash train` runs side by side on 2 cores: ~80-110 s each, against
# ~10 s alone and ~15 s side by side with passive waiting). So every test
# waits passively; benches and runs keep the default, faster for one process
# (docs/PERFORMANCE.md).
set(dflash_test_env_mod "OMP_WAIT_POLICY=set:PASSIVE")

find_package(GTest REQUIRED)
find_package(rapidcheck REQUIRED)
include(GoogleTest)

add_library(dflash_test_deps INTERFACE)
target_link_libraries(dflash_test_deps INTERFACE
  dflash_train dflash_harness GTest::gtest GTest::gtest_main rapidcheck rapidcheck_gtest)

file(GLOB DFLASH_TEST_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/core/*_test.cpp
  ${PROJECT_SOURCE_DIR}/reference/*_test.cpp
  ${PROJECT_SOURCE_DIR}/fixtures/*_test.cpp
  ${PROJECT_SOURCE_DIR}/harness/*_test.cpp
  ${PROJECT_SOURCE_DIR}/optimized/*_test.cpp
  ${PROJECT_SOURCE_DIR}/models/*_test.cpp
  ${PROJECT_SOURCE_DIR}/data/*_test.cpp
  ${PROJECT_SOURCE_DIR}/decode/*_test.cpp
  ${PROJECT_SOURCE_DIR}/dist/*_test.cpp
  ${PROJECT_SOURCE_DIR}/train/*_test.cpp
  ${PROJECT_SOURCE_DIR}/cli/*_test.cpp)

foreach(src ${DFLASH_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  get_filename_component(dir ${src} DIRECTORY)
  get_filename_component(area ${dir} NAME)
  set(exe ${area}_${name})
  if(name STREQUAL "nccl_gpu_test" AND NOT DFLASH_TORCH_HAS_CUDA)
    continue()  # its plugin needs the CUDA build of libtorch (ProcessGroupNCCL)
  endif()
  add_executable(${exe} ${src})
  dflash_setup_target(${exe})
  target_link_libraries(${exe} PRIVATE dflash_test_deps)
  if(name STREQUAL "nccl_gpu_test")
    add_dependencies(${exe} dflash_nccl)  # the plugin it loads
  endif()
  target_precompile_headers(${exe} REUSE_FROM dflash_pch)
  # *_gpu_test.cpp: the GPU check's tests (label gpu; skipped with the reason
  # where no CUDA device is visible; ci/gpu-check.sh runs them on a GPU).
  if(name MATCHES "_nightly_test$")
    set(label nightly)
  elseif(name MATCHES "_gpu_test$")
    set(label gpu)
  else()
    set(label quick)
  endif()
  gtest_discover_tests(${exe}
    TEST_PREFIX "${area}."
    DISCOVERY_MODE PRE_TEST
    NO_PRETTY_VALUES
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS ${label}
               # One variable only: gtest_discover_tests flattens a list value, and a
               # second NAME=VALUE is read as a property name and dropped. Tests
               # find the sources through the working directory (DFLASH_SOURCE_DIR
               # defaults to it) and the binary through DFLASH_BINARY.
               ENVIRONMENT "DFLASH_BINARY=$<TARGET_FILE:dflash>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
               ENVIRONMENT_MODIFICATION "${dflash_test_env_mod}")
endforeach()

# Command-line tests: the binary itself, driven by ci/cli_tests.sh.
add_test(NAME cli.dump_then_step_from_is_bitwise
  COMMAND bash ${PROJECT_SOURCE_DIR}/ci/cli_tests.sh dump_roundtrip $<TARGET_FILE:dflash>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.every_subcommand_has_help
  COMMAND bash ${PROJECT_SOURCE_DIR}/ci/cli_tests.sh help $<TARGET_FILE:dflash>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
foreach(case face bad_config hostile_configs optimized_step bench_smoke parity parity_failures preflight plan env bootstrap_check
             report_in_browser recipes torch_range)
  add_test(NAME cli.${case}
    COMMAND bash ${PROJECT_SOURCE_DIR}/ci/cli_tests.sh ${case} $<TARGET_FILE:dflash>
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.${case} PROPERTIES LABELS quick SKIP_RETURN_CODE 77)
endforeach()
# README's figures of the default run against the run itself (nightly).
add_test(NAME cli.readme_figures
  COMMAND bash ${PROJECT_SOURCE_DIR}/ci/cli_tests.sh readme_figures $<TARGET_FILE:dflash>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.readme_figures PROPERTIES LABELS nightly)
# Every mutant of ci/mutants.toml still applies to this tree (its find occurs
# exactly once): a code change that leaves a nightly mutant stale fails here,
# in the quick suite, instead of surviving silently in the nightly run.
find_package(Python3 3.11 COMPONENTS Interpreter)
set(dflash_ci_python "${Python3_EXECUTABLE}")
if(NOT Python3_FOUND)
  set(dflash_ci_python "${PROJECT_SOURCE_DIR}/ci/no-torch-python.sh")  # fails, saying why
endif()
add_test(NAME ci.mutant_finds_current
  COMMAND ${dflash_ci_python} ${PROJECT_SOURCE_DIR}/ci/mutants.py --check-finds
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(ci.mutant_finds_current PROPERTIES LABELS quick)
# The docs stand alone: docs/SPEC.md has every step that code and docs cite,
# nothing points outside the clone, relative doc links resolve.
add_test(NAME ci.docs_stand_alone
  COMMAND ${dflash_ci_python} ${PROJECT_SOURCE_DIR}/ci/docs_check.py ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(ci.docs_stand_alone PROPERTIES LABELS quick)
# Every #include points down the layer order (ci/layers_check.py).
add_test(NAME ci.includes_point_down
  COMMAND ${dflash_ci_python} ${PROJECT_SOURCE_DIR}/ci/layers_check.py ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(ci.includes_point_down PROPERTIES LABELS quick)
# safetensors files written by the reference implementation (the `safetensors`
# package in the torch environment) read by dflash, and the reverse.
# The python of libtorch's own environment (a reconfigure finds torch through
# the cached Torch_DIR and leaves DFLASH_TORCH_PYTHON unset).
set(dflash_test_python "${DFLASH_TORCH_PYTHON}")
get_filename_component(dflash_env_python "${DFLASH_TORCH_ROOT}/../../../../bin/python" ABSOLUTE)
if(NOT dflash_test_python AND EXISTS "${dflash_env_python}")
  set(dflash_test_python "${dflash_env_python}")
endif()
# They are registered whatever this configure found: without the torch
# environment's python they fail, saying so (command 2, ci/bootstrap.sh,
# provides it), instead of silently not existing.
if(NOT dflash_test_python)
  set(dflash_test_python "${PROJECT_SOURCE_DIR}/ci/no-torch-python.sh")
endif()
add_test(NAME cli.safetensors_interop
  COMMAND ${dflash_test_python} ${PROJECT_SOURCE_DIR}/ci/safetensors_interop.py
          $<TARGET_FILE:dflash> ${CMAKE_BINARY_DIR}/safetensors-interop
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# The shipped real-text target through Hugging Face transformers'
# Qwen3ForCausalLM, unchanged: its held-out bits per byte equal dflash's
# (77, skipped, where Debian's license texts are missing).
add_test(NAME cli.hf_qwen3_interop
  COMMAND ${dflash_test_python} ${PROJECT_SOURCE_DIR}/ci/hf_qwen3_interop.py
          ${PROJECT_SOURCE_DIR}/fixtures/targets/qwen3-bytes
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.safetensors_interop cli.hf_qwen3_interop
  PROPERTIES LABELS quick SKIP_RETURN_CODE 77)
# The chat-record parser's fuzz target (Python: atheris under ci/fuzz.sh)
# replays its corpus, seeds and regression inputs, as a quick test.
add_test(NAME fuzz.chat_records_corpus
  COMMAND ${dflash_test_python} ${PROJECT_SOURCE_DIR}/fuzz/chat_records_fuzz.py
          ${PROJECT_SOURCE_DIR}/fuzz/corpus/chat_records
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(fuzz.chat_records_corpus PROPERTIES LABELS quick)
# Python tests beside the code they cover (`<area>/<name>_test.py`), run by
# pytest with the torch environment's python: ctest name <area>.<name>. A
# test that skips (a missing optional environment, e.g. speculators) is
# reported as skipped by ctest, with pytest's reason in the output.
file(GLOB DFLASH_PY_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/*/*_test.py
     ${PROJECT_SOURCE_DIR}/python/dflash/*_test.py)
foreach(src ${DFLASH_PY_TESTS})
  get_filename_component(name ${src} NAME_WE)
  get_filename_component(dir ${src} DIRECTORY)
  get_filename_component(area ${dir} NAME)
  if(area STREQUAL "dflash")
    set(area python)  # python/dflash/*_test.py: the package's own tests
  endif()
  string(REGEX REPLACE "_test$" "" short ${name})
  add_test(NAME ${area}.${short}
    COMMAND ${dflash_test_python} -m pytest -q -rs -p no:cacheprovider ${src}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  # The package's tests import this checkout's python/dflash with this
  # build's op library (DFLASH_OPS_LIBRARY); python.package checks the
  # installed copy (ci/bootstrap.sh installs it).
  set_tests_properties(${area}.${short} PROPERTIES LABELS quick
    ENVIRONMENT "DFLASH_BINARY=$<TARGET_FILE:dflash>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python;DFLASH_OPS_LIBRARY=$<TARGET_FILE:dflash_torch_ops>"
    SKIP_REGULAR_EXPRESSION "SKIPPED \\[")
  # Under the sanitizers (ci/sanitize.sh) the op library is instrumented and
  # cannot load into the uninstrumented python: the tests that load it are
  # listed as disabled there, not silently passed.
  if(DFLASH_SANITIZE AND short MATCHES "^(ops|compile_checkpoint|dump|leakage|package)$")
    set_tests_properties(${area}.${short} PROPERTIES DISABLED TRUE)
  endif()
endforeach()
# The GitHub Actions workflows parse (PyYAML, in the torch environment
# through transformers) and run the README's commands (.github/workflows/).
add_test(NAME ci.workflows_parse
  COMMAND ${dflash_test_python} ${PROJECT_SOURCE_DIR}/ci/workflows_check.py ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(ci.workflows_parse PROPERTIES LABELS quick)
set_tests_properties(cli.dump_then_step_from_is_bitwise cli.every_subcommand_has_help
  PROPERTIES LABELS quick)

# The tests registered here by add_test (command-line and interop tests)
# wait passively too (the GoogleTest cases get it through their discovery).
get_property(dflash_added_tests DIRECTORY PROPERTY TESTS)
set_tests_properties(${dflash_added_tests} PROPERTIES
  ENVIRONMENT_MODIFICATION "${dflash_test_env_mod}")
