# The torch versions dflash builds against: cmake/TORCH_RANGE holds the
# lowest and the highest major.minor (inclusive); cmake/TORCH_VERSION the
# default that ci/bootstrap.sh installs (the GPU machines' torch).
# docs/BUILDING.md lists the versions tested and when.
#
# As a script, it checks one version (the test ci.torch_range):
#   cmake -DDFLASH_CHECK_TORCH=2.10.1 -P cmake/TorchRange.cmake

file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/TORCH_RANGE dflash_torch_range LIMIT_COUNT 1)
string(REPLACE " " ";" dflash_torch_range "${dflash_torch_range}")
list(GET dflash_torch_range 0 DFLASH_TORCH_MIN)
list(GET dflash_torch_range 1 DFLASH_TORCH_MAX)

# FATAL_ERROR unless `version` (e.g. 2.13.0 or 2.13.0+cu130) lies in the range.
function(dflash_check_torch_version version where)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" minor "${version}")
  if(NOT minor OR minor VERSION_LESS DFLASH_TORCH_MIN OR minor VERSION_GREATER DFLASH_TORCH_MAX)
    message(FATAL_ERROR
      "dflash: found libtorch ${version}${where}, but dflash builds against torch "
      "${DFLASH_TORCH_MIN} to ${DFLASH_TORCH_MAX} (cmake/TORCH_RANGE). Run ci/bootstrap.sh "
      "(it installs torch ${DFLASH_TORCH_DEFAULT}), or point -DDFLASH_TORCH_PYTHON / -DTorch_DIR "
      "at a torch in that range.")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND DEFINED DFLASH_CHECK_TORCH)
  file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/TORCH_VERSION DFLASH_TORCH_DEFAULT LIMIT_COUNT 1)
  dflash_check_torch_version("${DFLASH_CHECK_TORCH}" "")
  message(STATUS "dflash: torch ${DFLASH_CHECK_TORCH} is in ${DFLASH_TORCH_MIN} to ${DFLASH_TORCH_MAX}")
endif()
