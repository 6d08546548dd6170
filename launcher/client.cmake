# Clients of the public API (included from launcher/CMakeLists.txt).
#   ltm-client   command-line client: generate (streamed or unary), tokenize, model info
#   ltm-loadgen  load generator: throughput and latency of a running server
# Connection flags (TLS, API key) shared by both; auth.cpp reads the key file as the server does.
add_library(ltm_client_connection STATIC client_connection.cpp ${PROJECT_SOURCE_DIR}/runtime/serve/auth.cpp)
target_include_directories(ltm_client_connection PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(ltm_client_connection PUBLIC ltm_proto ltm_common Boost::program_options)

add_executable(ltm-client client_main.cpp)
target_link_libraries(ltm-client PRIVATE ltm_client_connection)

add_executable(ltm-loadgen loadgen_main.cpp)
target_link_libraries(ltm-loadgen PRIVATE ltm_client_connection)
