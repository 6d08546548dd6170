# ltm_find_nccl(): finds NCCL's header and shared library, also where NVIDIA's Python wheels put
# them (PyTorch's nvidia-nccl-cu* wheel ships lib/libnccl.so.2 with no libnccl.so beside it, and
# the header in site-packages/nvidia/nccl/include). Sets LTM_NCCL_INCLUDE and LTM_NCCL_LIBRARY
# (cache), or stops the configure with one message that says where it looked and what to do.
# Looked at, in order: -DNCCL_ROOT / $NCCL_ROOT / $NCCL_HOME, the CUDA toolkit (include/, lib/,
# lib64/), the nvidia/nccl folder of every Python we can ask (LTM_SYSTEM_PYTHON, python3 on PATH),
# then site-packages folders found by glob (no Python needed). LTM_NCCL_ROOTS_ONLY=ON (for
# tests/tools/check_find_nccl.sh) looks at the first group only and at no system folder.

# Appends the CUDA toolkit's folder, every Python's nvidia/nccl and the globbed site-packages ones.
macro(ltm_nccl_default_roots _roots)
  if(CUDAToolkit_LIBRARY_ROOT)
    list(APPEND ${_roots} "${CUDAToolkit_LIBRARY_ROOT}")
  endif()
  if(CUDAToolkit_INCLUDE_DIRS)
    foreach(_inc ${CUDAToolkit_INCLUDE_DIRS})
      get_filename_component(_up "${_inc}" DIRECTORY)
      list(APPEND ${_roots} "${_up}")
    endforeach()
  endif()
  list(APPEND ${_roots} /usr/local/cuda)
  # Python wheels: ask each interpreter where the nvidia.nccl package lives.
  find_program(_ltm_path_python NAMES python3 NO_CACHE)
  foreach(_py "${LTM_SYSTEM_PYTHON}" "${_ltm_path_python}")
    if(_py AND EXISTS "${_py}")
      execute_process(
        COMMAND "${_py}" -c "import nvidia.nccl as m; print(';'.join(m.__path__))"
        OUTPUT_VARIABLE _dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc
        TIMEOUT 20)
      if(_rc EQUAL 0 AND _dirs)
        list(APPEND ${_roots} ${_dirs})
      endif()
    endif()
  endforeach()
  file(GLOB _wheel_dirs LIST_DIRECTORIES true
       /usr/local/lib/python3*/dist-packages/nvidia/nccl
       /usr/local/lib/python3*/site-packages/nvidia/nccl
       /usr/lib/python3/dist-packages/nvidia/nccl
       $ENV{HOME}/.local/lib/python3*/site-packages/nvidia/nccl
       $ENV{VIRTUAL_ENV}/lib/python3*/site-packages/nvidia/nccl
       $ENV{CONDA_PREFIX}/lib/python3*/site-packages/nvidia/nccl
       /opt/conda/lib/python3*/site-packages/nvidia/nccl)
  list(APPEND ${_roots} ${_wheel_dirs})
endmacro()

function(ltm_find_nccl)
  set(_roots)
  foreach(_r "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
    if(_r)
      list(APPEND _roots "${_r}")
    endif()
  endforeach()
  set(_no_default)
  if(LTM_NCCL_ROOTS_ONLY)
    set(_no_default NO_DEFAULT_PATH)
  else()
    ltm_nccl_default_roots(_roots)
  endif()
  list(REMOVE_DUPLICATES _roots)

  find_path(LTM_NCCL_INCLUDE nccl.h HINTS ${_roots} PATH_SUFFIXES include ${_no_default}
            DOC "Folder of NCCL's nccl.h")
  # In each folder (in the order above) libnccl.so, then the wheel's libnccl.so.2.
  find_library(LTM_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_roots}
               PATH_SUFFIXES lib lib64 ${_no_default} DOC "NCCL's shared library")
  if(NOT LTM_NCCL_INCLUDE OR NOT LTM_NCCL_LIBRARY)
    string(REPLACE ";" "\n    " _where "${_roots}")
    message(FATAL_ERROR
      "The CUDA backend (LTM_CUDA=ON, the default where nvcc is found) needs NCCL, "
      "but NCCL was not found "
      "(nccl.h: ${LTM_NCCL_INCLUDE}; libnccl.so or libnccl.so.2: ${LTM_NCCL_LIBRARY}). "
      "Looked under (and the system library folders):\n    ${_where}\n"
      "Point -DNCCL_ROOT=<dir> (or $NCCL_ROOT) at a folder holding include/nccl.h and "
      "lib/libnccl.so[.2] (pip's nvidia-nccl-cu13 wheel puts one in site-packages/nvidia/nccl), "
      "or build without the GPU backend: -DLTM_CUDA=OFF.")
  endif()
  message(STATUS "NCCL: ${LTM_NCCL_LIBRARY} (header in ${LTM_NCCL_INCLUDE})")
endfunction()
