#!/usr/bin/env bash
# gpu_only_build_test: the GPU-only build (-DLTM_GPU_ONLY=ON, cmake/gpu_only.cmake) configures and
# compiles with MPI, gRPC, Protobuf, Boost, OpenBLAS and abseil hidden from CMake, the compiler
# and the linker (and spdlog, fmt, GoogleTest and nlohmann_json too: it is built with
# LTM_USE_FALLBACKS=ON, the stand-ins a bare GPU machine gets), and what it builds needs none of
# them.
#   check_gpu_only_build.sh SOURCE_DIR BUILD_DIR FULL_WORKER [CUDA_ARCH (default 80)] [LAUNCHER]
# 1. In a private mount namespace (unshare -m) the packages' headers, CMake and pkg-config files,
#    libraries and programs are covered (empty tmpfs over their folders; over their files, one
#    that fails every use), and probes check they are gone: compiling a file that includes
#    <boost/version.hpp>, <absl/base/config.h>, <mpi.h>, <cblas.h>, <grpcpp/grpcpp.h>,
#    <google/protobuf/message.h>, <spdlog/spdlog.h>, <fmt/format.h>, <gtest/gtest.h> or
#    <nlohmann/json.hpp> must fail,
#    and so must linking -lmpi, -lopenblas, -lboost_program_options, -labsl_strings, -lgrpc++,
#    -lprotobuf, -lspdlog, -lfmt or -lgtest. Then cmake configures BUILD_DIR and builds every
#    target of that build (the CUDA backend, the gpu tests, ltm-worker, ltm-bench,
#    ltm-gpu-limits). To stay cheap in CI: CUDA code for one architecture (CUDA_ARCH) only, half
#    the device compile time of the default "80;90", and no optimisation of host code
#    (CMAKE_BUILD_TYPE=None); the test is about what the build includes and links, not its speed
#    or the GPU it targets.
# 2. Outside the namespace: readelf -d of every executable and shared library built names none of
#    the hidden libraries, and none leaves an undefined symbol of theirs (MPI_, cblas_, absl,
#    boost, grpc, protobuf, spdlog, fmt, testing::); ltm-worker links NCCL.
# 3. The binaries run: ltm-worker and ltm-bench answer --help; a gpu test binary exits 77 (no CUDA
#    device here: skipped) or passes; the GoogleTest stand-in's self-test reports exactly the
#    outcomes its tests are named for; the GPU-only ltm-worker generates on the CPU backend
#    (--device cpu, the checked-in kjv-small model, greedy) the same token ids as FULL_WORKER, the
#    full build's ltm-worker, and refuses --listen with a message naming the GPU-only build.
# Skipped (exit 77) without nvcc or without the privilege to make a mount namespace.
set -uo pipefail
src=$1 dir=$2 full_worker=$3 arch=${4:-80} launcher=${5:-}
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || skip "no nvcc (the GPU-only build needs the CUDA toolkit)"
unshare -m true 2> /dev/null || skip "cannot make a mount namespace (unshare -m needs root or CAP_SYS_ADMIN)"
command -v readelf > /dev/null && command -v nm > /dev/null || skip "no readelf/nm (binutils)"

multiarch=$(gcc -print-multiarch 2> /dev/null || echo x86_64-linux-gnu)
mkdir -p "$dir"
t0=$SECONDS

# What to cover. Folders get an empty tmpfs; files (libraries, headers, programs, pkg-config and
# CMake files that share a folder with others) get a file that fails every use (below).
hide_dirs=()
hide_files=()
for d in /usr/include/{boost,absl,grpc,grpc++,grpcpp,grpc_core,google,spdlog,fmt,gtest,gmock,nlohmann} \
         /usr/include/$multiarch/{mpi,openmpi,openblas-openmp,openblas-pthread} \
         /usr/lib/$multiarch/{openmpi,openblas-openmp,openblas-pthread,blas,lapack} \
         /usr/lib/$multiarch/cmake/{absl,grpc,protobuf,openblas,Boost-*,boost_*,BoostDetectToolset*,spdlog,fmt,GTest,nlohmann_json} \
         /usr/share/openmpi /etc/openmpi /usr/share/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json; do
  [ -d "$d" ] && hide_dirs+=("$d")
done
shopt -s nullglob
for f in /usr/include/$multiarch/{cblas*.h,f77blas.h,openblas_config.h,mpi*.h} /usr/include/{cblas*.h,mpi*.h} \
         /usr/lib/$multiarch/lib{absl_,grpc,gpr,upb,protobuf,protoc,boost_,mpi,open-pal,open-rte,ompitrace,openblas,blas,lapack,cblas,address_sorting,spdlog,fmt,gtest,gmock}* \
         /usr/lib/$multiarch/pkgconfig/{absl_,grpc,gpr,upb,protobuf,ompi,orte,mpi,openblas,blas,lapack,cblas,spdlog,fmt,gtest,gmock,nlohmann_json}* \
         /usr/share/pkgconfig/nlohmann_json* \
         /usr/bin/{protoc*,grpc_*plugin,mpicc*,mpicxx*,mpic++*,mpiCC*,mpif*,mpirun*,mpiexec*,orterun*,ompi_info*,ompi-*,opal_wrapper*}; do
  [ -e "$f" ] && hide_files+=("$f")
done
shopt -u nullglob

# Runs inside the namespace: cover, probe, configure, build.
inner=$(cat << 'EOF'
set -uo pipefail
dir=$1 src=$2 arch=$3 launcher=$4 n_dirs=$5
shift 5
dirs=("${@:1:$n_dirs}")
files=("${@:$((n_dirs + 1))}")
probe=$(mktemp -d)
mount -t tmpfs -o size=16m tmpfs "$probe" || exit 90  # gone with the namespace
# A file that fails every use: not C++ (a header), neither ELF nor a linker script (a library),
# not executable (a program).
printf 'HIDDEN (check_gpu_only_build.sh)\n#error hidden by check_gpu_only_build.sh\n' > "$probe/hidden"
chmod 444 "$probe/hidden"
for d in "${dirs[@]}"; do mount -t tmpfs -o ro,size=4k tmpfs "$d" || exit 90; done
# (a link into a folder covered above now leads nowhere: already hidden)
for f in "${files[@]}"; do [ ! -e "$f" ] || mount --bind "$probe/hidden" "$f" || exit 90; done
for h in boost/version.hpp absl/base/config.h mpi.h cblas.h grpcpp/grpcpp.h google/protobuf/message.h \
         spdlog/spdlog.h fmt/format.h gtest/gtest.h nlohmann/json.hpp; do
  printf '#include <%s>\nint main() { return 0; }\n' "$h" > "$probe/p.cpp"
  if g++ -std=c++20 -c "$probe/p.cpp" -o "$probe/p.o" 2> /dev/null; then
    echo "FAIL: <$h> still compiles inside the namespace (not hidden)"; exit 91
  fi
done
printf 'int main() { return 0; }\n' > "$probe/m.cpp"
for l in mpi mpi_cxx openblas blas boost_program_options absl_strings absl_status grpc++ grpc protobuf \
         spdlog fmt gtest; do
  if g++ "$probe/m.cpp" -o "$probe/m" -l"$l" 2> /dev/null; then
    echo "FAIL: -l$l still links inside the namespace (not hidden)"; exit 91
  fi
done
echo "hidden: ${#dirs[@]} folders and ${#files[@]} files; the probes cannot include or link them"
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
opts=()
if [ -n "$launcher" ]; then
  opts+=(-DCMAKE_C_COMPILER_LAUNCHER="$launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"
         -DCMAKE_CUDA_COMPILER_LAUNCHER="$launcher")
fi
cmake -S "$src" -B "$dir" "${gen[@]}" "${opts[@]}" -DLTM_GPU_ONLY=ON -DLTM_USE_FALLBACKS=ON -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$dir/configure.log" 2>&1 ||
  { tail -30 "$dir/configure.log"; echo "FAIL: configure"; exit 92; }
grep -E "GPU-only build|NCCL:" "$dir/configure.log"
cmake --build "$dir" -j"$(nproc)" > "$dir/build.log" 2>&1 ||
  { grep -E "error|Error" "$dir/build.log" | head -30; tail -20 "$dir/build.log"; echo "FAIL: build"; exit 93; }
EOF
)
echo "configure + build in $dir (CUDA architecture $arch)"
unshare -m --propagation private bash -c "$inner" inner "$dir" "$src" "$arch" "$launcher" \
  "${#hide_dirs[@]}" "${hide_dirs[@]}" "${hide_files[@]}"
rc=$?
[ $rc -eq 0 ] || fail "inside the namespace (exit $rc)"
echo "built in $((SECONDS - t0)) s"

# 2. What the binaries need.
worker=$dir/launcher/ltm-worker
bench=$dir/launcher/ltm-bench
[ -x "$worker" ] && [ -x "$bench" ] || fail "ltm-worker or ltm-bench not built"
[ -f "$dir/lib/libltm_backend_cuda.so" ] || fail "the CUDA backend plugin (lib/libltm_backend_cuda.so) not built"
gpu_tests=("$dir"/tests/*_gpu_test)
[ -x "${gpu_tests[0]}" ] || fail "no gpu test built in $dir/tests"
[ -x "$dir/tests/ltm-gpu-limits" ] || fail "ltm-gpu-limits not built"
bins=("$worker" "$bench" "$dir/lib/libltm_backend_cuda.so" "$dir/tests/ltm-gpu-limits" "${gpu_tests[@]}")
[ -x "$dir/tests/nccl_link_check" ] && bins+=("$dir/tests/nccl_link_check")
forbidden='mpi|open-pal|open-rte|grpc|gpr|upb|protobuf|boost|openblas|blas|lapack|absl|spdlog|fmt|gtest|gmock'
for b in "${bins[@]}"; do
  needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(printf '%s\n' "$needed" | grep -E "lib($forbidden)" || true)
  [ -z "$bad" ] || fail "$(basename "$b") needs $(echo $bad)"
  undef=$(nm -D --undefined-only "$b" 2> /dev/null | grep -E ' (MPI_|PMPI_|cblas_|openblas_|_ZN4absl|_ZN5boost|_ZN4grpc|_ZN6google8protobuf|_ZN6spdlog|_ZN3fmt|_ZN7testing)' | head -3 || true)
  [ -z "$undef" ] || fail "$(basename "$b") has undefined symbols of a hidden library: $undef"
  echo "ok: $(basename "$b") needs $(echo $needed)"
done
grep -q 'libnccl' <(readelf -d "$worker") || fail "ltm-worker does not link NCCL"

# 3. They run.
"$worker" --help > /dev/null || fail "ltm-worker --help"
"$bench" --help > /dev/null || fail "ltm-bench --help"
"${gpu_tests[0]}" > "$dir/gpu_test_run.log" 2>&1
rc=$?
[ $rc -eq 77 ] || [ $rc -eq 0 ] || { cat "$dir/gpu_test_run.log"; fail "$(basename "${gpu_tests[0]}") exited $rc"; }
echo "ok: $(basename "${gpu_tests[0]}") exited $rc ($([ $rc -eq 77 ] && echo 'skipped: no CUDA device' || echo passed))"
# The GoogleTest stand-in on tests whose outcome their names say (gtest_subset_selftest.cpp).
selftest=$dir/tests/gtest_subset_selftest
[ -x "$selftest" ] || fail "gtest_subset_selftest not built (the GoogleTest stand-in is not in use?)"
"$selftest" > "$dir/selftest.log" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$dir/selftest.log"; fail "gtest_subset_selftest exited $rc, not 1 (it has failing tests)"; }
got_failed=$(sed -n 's/^\[  FAILED  \] \([A-Za-z_/.0-9]*\)$/\1/p' "$dir/selftest.log" | sort | tr '\n' ' ')
got_skipped=$(sed -n 's/^\[  SKIPPED \] \([A-Za-z_/.0-9]*\)$/\1/p' "$dir/selftest.log" | sort | tr '\n' ' ')
want_failed="Fail.AssertStops Fail.DidNotDie Fail.ExitedWithAnotherCode Fail.ExpectKeepsGoing Fail.NearOutsideTolerance "
[ "$got_failed" = "$want_failed" ] || { cat "$dir/selftest.log"; fail "gtest stand-in: failed '$got_failed', expected '$want_failed'"; }
[ "$got_skipped" = "Skip.SkipsItself " ] || { cat "$dir/selftest.log"; fail "gtest stand-in: skipped '$got_skipped'"; }
grep -q '^\[  PASSED  \] 9 tests\.$' "$dir/selftest.log" || { cat "$dir/selftest.log"; fail "gtest stand-in: not 9 passed"; }
grep -q 'REACHED (wrong)\|reached (wrong)' "$dir/selftest.log" && fail "gtest stand-in: a statement after ASSERT or GTEST_SKIP ran"
grep -q 'after a failed EXPECT: reached' "$dir/selftest.log" || fail "gtest stand-in: EXPECT stopped the test"
"$selftest" --gtest_filter='Pass.*:*Pass*:-*Grid*' > "$dir/selftest_filter.log" 2>&1 ||
  { cat "$dir/selftest_filter.log"; fail "gtest stand-in: the passing tests failed under a filter"; }
grep -q '^\[  PASSED  \] 3 tests\.$' "$dir/selftest_filter.log" || { cat "$dir/selftest_filter.log"; fail "gtest stand-in: --gtest_filter"; }
echo "ok: the GoogleTest stand-in reports 9 passed, 5 failed, 1 skipped as named; filters work"

msg=$("$worker" --model "$src/models/kjv-small" --listen 127.0.0.1:1 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q 'GPU-only build' <<< "$msg" || fail "ltm-worker --listen: exit $rc, '$msg'"
run=(--model "$src/models/kjv-small" --prompt "In the beginning" --max-new-tokens 12 --device cpu
     --threads 1 --output json)
gpu_only_out=$("$worker" "${run[@]}" 2> "$dir/worker_cpu.log") || { cat "$dir/worker_cpu.log"; fail "GPU-only ltm-worker --device cpu"; }
full_out=$("$full_worker" "${run[@]}" 2> /dev/null) || fail "the full build's ltm-worker ($full_worker)"
ids() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("generated_ids", d.get("ids")))'; }
a=$(ids <<< "$gpu_only_out") b=$(ids <<< "$full_out")
[ -n "$a" ] && [ "$a" != None ] || fail "no generated ids in the GPU-only worker's output: $gpu_only_out"
[ "$a" = "$b" ] || fail "GPU-only ltm-worker generated $a, the full build $b"
echo "ok: one-shot on the CPU backend: the same 12 tokens as the full build ($a)"
echo "PASS: GPU-only build in $((SECONDS - t0)) s"
