# The GPU-only build (-DLTM_GPU_ONLY=ON; issue 20, item 6): the CUDA backend, its gpu tests, a
# one-rank ltm-bench and a one-shot ltm-worker, on a machine with nvcc, cmake, NCCL (PyTorch's
# wheels will do) and a C++ compiler, and none of MPI, gRPC, Protobuf, Boost, OpenBLAS or abseil
# (scripts/gpu_check's machine: no Debian -dev packages, no network).
#
# Those six are never looked for here, even where installed. What the GPU-only targets use of
# them has a small stand-in of our own (common/fallback/), under the target names the folders'
# CMake files already link, so those files need no second version:
#   abseil          absl::status, ... -> common/fallback/absl_subset.h (Status, StatusOr, StrCat,
#                   StrFormat, ...), reached through common/fallback/include/absl/...
#   Boost           Boost::program_options -> common/fallback/program_options_subset.h
#   MPI             MPI::MPI_CXX -> common/fallback/include/mpi.h, a world of one rank
#   OpenBLAS        PkgConfig::OPENBLAS -> common/fallback/cblas_subset.cpp (plain sgemm, sgemv)
#   gRPC, Protobuf  not needed: proto/, runtime/serve and runtime/chat are not built, and
#                   ltm-worker is one-shot only (launcher/worker_run.cpp refuses --listen)
# spdlog, GoogleTest and nlohmann_json are used where installed, with stand-ins of our own where
# not (below; PyTorch's wheels do not ship nlohmann's header, so a bare GPU machine has none).
if(NOT LTM_NVCC)
  message(FATAL_ERROR "LTM_GPU_ONLY=ON builds the CUDA backend, but nvcc was not found (looked on "
                      "PATH and in /usr/local/cuda/bin); put the CUDA toolkit's bin/ on PATH")
endif()
set(LTM_CUDA ON CACHE BOOL "Build the CUDA backend and the NCCL communicator" FORCE)
set(LTM_FALLBACK_INCLUDE ${PROJECT_SOURCE_DIR}/common/fallback/include)
message(STATUS "GPU-only build: no MPI, gRPC, Protobuf, Boost, OpenBLAS or abseil "
               "(stand-ins in common/fallback/)")

add_library(ltm_fallback_headers INTERFACE)
target_include_directories(ltm_fallback_headers INTERFACE ${LTM_FALLBACK_INCLUDE}
                           ${PROJECT_SOURCE_DIR})
foreach(_t absl::status absl::statusor absl::strings absl::str_format absl::flat_hash_map
           Boost::program_options Boost::headers MPI::MPI_CXX)
  add_library(${_t} ALIAS ltm_fallback_headers)
endforeach()

add_library(ltm_fallback_cblas STATIC ${PROJECT_SOURCE_DIR}/common/fallback/cblas_subset.cpp)
target_include_directories(ltm_fallback_cblas PUBLIC ${LTM_FALLBACK_INCLUDE})
target_link_libraries(ltm_fallback_cblas PUBLIC OpenMP::OpenMP_CXX)
add_library(PkgConfig::OPENBLAS ALIAS ltm_fallback_cblas)

# spdlog and GoogleTest: the installed ones where found, else our stand-ins
# (common/fallback/spdlog_subset.h, tests/fallback/). LTM_USE_FALLBACKS=ON takes the stand-ins
# even where the packages are installed: CI's gpu_only_build_test builds what a bare GPU machine
# builds that way.
option(LTM_USE_FALLBACKS "GPU-only build: our stand-ins for spdlog, GoogleTest and nlohmann_json even where installed" OFF)
if(NOT LTM_USE_FALLBACKS)
  find_package(spdlog QUIET)
  find_package(GTest QUIET)
  find_package(nlohmann_json QUIET)
endif()
if(NOT spdlog_FOUND)
  add_library(ltm_fallback_spdlog INTERFACE)
  target_include_directories(ltm_fallback_spdlog INTERFACE ${PROJECT_SOURCE_DIR}/common/fallback/spdlog
                             ${PROJECT_SOURCE_DIR})
  add_library(spdlog::spdlog ALIAS ltm_fallback_spdlog)
  message(STATUS "GPU-only build: spdlog's stand-in (common/fallback/spdlog_subset.h)")
endif()
if(NOT GTest_FOUND)
  add_library(ltm_fallback_gtest STATIC ${PROJECT_SOURCE_DIR}/tests/fallback/gtest_subset.cpp)
  target_include_directories(ltm_fallback_gtest PUBLIC ${PROJECT_SOURCE_DIR}/tests/fallback)
  add_library(GTest::gtest ALIAS ltm_fallback_gtest)
  set(GTest_FOUND TRUE)
  set(LTM_FALLBACK_GTEST ON)
  message(STATUS "GPU-only build: GoogleTest's stand-in (tests/fallback/gtest/gtest.h)")
endif()
# nlohmann_json (header-only) reads configs, checkpoints' headers and vocabularies, and writes the
# JSON reports; where it is not installed, our subset of its API (common/fallback/json_subset.h,
# reached as <nlohmann/json.hpp> through common/fallback/json/ only then).
if(NOT nlohmann_json_FOUND)
  add_library(ltm_fallback_json INTERFACE)
  target_include_directories(ltm_fallback_json INTERFACE ${PROJECT_SOURCE_DIR}/common/fallback/json
                             ${PROJECT_SOURCE_DIR})
  add_library(nlohmann_json::nlohmann_json ALIAS ltm_fallback_json)
  message(STATUS "GPU-only build: nlohmann_json's stand-in (common/fallback/json_subset.h)")
endif()
