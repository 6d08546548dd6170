# Clients of the public API (included from launcher/CMakeLists.txt).
#   ltm-client   command-line client: generate (streamed or unary), tokenize, model info
#   ltm-loadgen  load generator: throughput and latency of a running server
add_executable(ltm-client client_main.cpp)
target_link_libraries(ltm-client PRIVATE ltm_proto ltm_common Boost::program_options)

add_executable(ltm-loadgen loadgen_main.cpp)
target_link_libraries(ltm-loadgen PRIVATE ltm_proto ltm_common Boost::program_options)
