# Sourced by scripts/build, test_asan, test_tsan and fuzz: configures a CMake build directory the
# same way for all of them.
#   ltm_configure SOURCE_DIR BUILD_DIR LOG [cmake options...]
# Ninja (Debian's ninja-build, which scripts/setup installs) where present: it starts a target's
# compiles as soon as their inputs exist instead of after every target they link to, which keeps
# both cores busy behind the long units (the HTTP session's Boost.Beast code takes 30 s, 90 s
# with ASan + UBSan). A directory configured earlier with another generator is reconfigured.
# ccache, where installed, makes rebuilds in several work trees cheap (developers; CI has none).
ltm_configure() {
  local src=$1 dir=$2 log=$3
  shift 3
  local args=()
  if command -v ninja >/dev/null; then
    args+=(-G Ninja)
    if [ -f "$dir/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
      rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
    fi
  fi
  if command -v ccache >/dev/null; then
    args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
           -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  if ! cmake -S "$src" -B "$dir" "${args[@]}" "$@" > "$log" 2>&1; then
    cat "$log"
    return 1
  fi
}
