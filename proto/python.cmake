# Python stubs of the public API for clients/python/ltm_client.py (included from
# proto/CMakeLists.txt): ${PROJECT_BINARY_DIR}/python/ltm/v1/ltm_pb2.py and ltm_pb2_grpc.py.
#
# Generated with the system protoc and Debian's grpc_python_plugin (protobuf-compiler-grpc), not
# `python3 -m grpc_tools.protoc`: Debian's python3-grpc-tools (1.14) bundles a protoc that predates
# proto3 `optional`, which ltm.proto uses. The stubs need python3-protobuf (3.21) and
# python3-grpcio at run time, both from Debian.
find_program(LTM_GRPC_PYTHON_PLUGIN grpc_python_plugin)
if(LTM_GRPC_PYTHON_PLUGIN)
  set(_ltm_py_out ${PROJECT_BINARY_DIR}/python)
  set(_ltm_py_files ${_ltm_py_out}/ltm/v1/ltm_pb2.py ${_ltm_py_out}/ltm/v1/ltm_pb2_grpc.py)
  add_custom_command(
    OUTPUT ${_ltm_py_files}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_ltm_py_out}
    COMMAND protobuf::protoc --proto_path=${CMAKE_CURRENT_SOURCE_DIR} --python_out=${_ltm_py_out}
            --grpc_out=${_ltm_py_out} --plugin=protoc-gen-grpc=${LTM_GRPC_PYTHON_PLUGIN}
            ${CMAKE_CURRENT_SOURCE_DIR}/ltm/v1/ltm.proto
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ltm/v1/ltm.proto
    COMMENT "Python stubs of ltm/v1/ltm.proto"
    VERBATIM)
  add_custom_target(ltm_proto_python ALL DEPENDS ${_ltm_py_files})
else()
  message(WARNING "grpc_python_plugin not found (Debian package protobuf-compiler-grpc): "
                  "the Python client's stubs will not be built")
endif()
