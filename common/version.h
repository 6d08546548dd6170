// The build's version: `git describe --always --dirty` of the source tree when CMake configured
// the build (common/CMakeLists.txt), else the project version from CMakeLists.txt followed by
// "-nogit" (a source tarball, or git missing). Every binary prints it for --version.
#pragma once

#include <string>

namespace ltm {

const char* version();
// "NAME VERSION\n" (what --version prints).
std::string version_line(const char* program);

}  // namespace ltm
