# One loop builds every Google Benchmark binary: `harness/<name>_bench.cpp`
# (they compare builds through the harness, so they live in its layer).
find_package(benchmark REQUIRED)
file(GLOB DFLASH_BENCH_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/harness/*_bench.cpp)
foreach(src ${DFLASH_BENCH_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  get_filename_component(dir ${src} DIRECTORY)
  get_filename_component(area ${dir} NAME)
  add_executable(${area}_${name} ${src})
  dflash_setup_target(${area}_${name})
  target_link_libraries(${area}_${name} PRIVATE dflash_harness benchmark::benchmark)
  target_precompile_headers(${area}_${name} REUSE_FROM dflash_pch)
endforeach()
