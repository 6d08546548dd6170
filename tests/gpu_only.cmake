# The tests of the GPU-only build (cmake/gpu_only.cmake; included by tests/CMakeLists.txt, which
# names each folder's library): every tests/<dir>/*_gpu_test.cpp (label gpu; exit 77, skipped,
# without a device), ltm-gpu-limits (scripts/gpu_check's limits) and nccl_link_check. They link
# what they link in the full build.
file(GLOB LTM_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*/*_gpu_test.cpp)
foreach(_src ${LTM_GPU_TESTS})
  get_filename_component(_name ${_src} NAME_WE)
  get_filename_component(_dir ${_src} DIRECTORY)
  get_filename_component(_dir ${_dir} NAME)
  if(NOT DEFINED LTM_TEST_LIBRARY_${_dir} OR NOT TARGET ${LTM_TEST_LIBRARY_${_dir}})
    message(FATAL_ERROR "tests/${_dir}/${_name}: its folder's library is not in the GPU-only build")
  endif()
  add_executable(${_name} ${_src} ${CMAKE_CURRENT_SOURCE_DIR}/kernels/gpu_test_main.cpp)
  target_link_libraries(${_name} PRIVATE ${LTM_TEST_LIBRARY_${_dir}} GTest::gtest CUDA::cudart)
  target_compile_definitions(${_name} PRIVATE LTM_HAVE_CUDA=1)
  target_include_directories(${_name} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME ${_name} COMMAND ${_name})
  set_tests_properties(${_name} PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${LTM_TEST_ENV}")
endforeach()

add_executable(ltm-gpu-limits tools/gpu_limits.cpp)
target_link_libraries(ltm-gpu-limits PRIVATE CUDA::cudart CUDA::cublas)

if(LTM_NCCL_LIBRARY)
  add_executable(nccl_link_check parallel/nccl_link_check.cpp)
  target_link_libraries(nccl_link_check PRIVATE ltm_parallel CUDA::cudart)
  target_include_directories(nccl_link_check PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME nccl_link_check COMMAND nccl_link_check)
  set_tests_properties(nccl_link_check PROPERTIES LABELS gpu TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()

# The GoogleTest stand-in's own check (tests/fallback/gtest_subset_selftest.cpp), built where the
# stand-in is; check_gpu_only_build.sh runs it and reads its report.
if(LTM_FALLBACK_GTEST)
  add_executable(gtest_subset_selftest fallback/gtest_subset_selftest.cpp)
  target_link_libraries(gtest_subset_selftest PRIVATE GTest::gtest)
endif()
