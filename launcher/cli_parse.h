// The first steps of every ltm binary's command line, in one place: store argv, answer --help
// and --version, then run boost's notify (required options, value checks). Errors are boost's
// exceptions, for the caller's own message and exit code.
#pragma once

#include <boost/program_options.hpp>
#include <cstdio>
#include <sstream>
#include <string>

#include "common/version.h"

namespace ltm {

enum class CliStart { kRun, kDone };  // kDone: --help or --version was answered (exit 0)

// `help`: what --help prints (empty: the options' description); `program`: the name --version
// prints.
inline CliStart parse_cli(int argc, char** argv, const boost::program_options::options_description& desc,
                          const std::string& help, const char* program,
                          boost::program_options::variables_map* vm) {
  namespace po = boost::program_options;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), *vm);
  if (vm->count("help")) {
    if (help.empty()) {
      std::ostringstream out;
      out << desc;
      std::fputs(out.str().c_str(), stdout);
    } else {
      std::fputs(help.c_str(), stdout);
    }
    return CliStart::kDone;
  }
  if (vm->count("version")) {
    std::fputs(version_line(program).c_str(), stdout);
    return CliStart::kDone;
  }
  po::notify(*vm);
  return CliStart::kRun;
}

}  // namespace ltm
