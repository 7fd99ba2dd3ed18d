// What the CPU backend runs on: the BLAS library's kernel family and threads.
#pragma once
#include <string>

namespace lns {

// e.g. "OpenBLAS 0.3.21, kernel SkylakeX, 2 threads"
std::string cpu_blas_info();
// A warning when OpenBLAS chose its generic kernel on a CPU that has AVX2 or
// AVX-512 (about 2x slower); empty otherwise.
std::string cpu_blas_warning();

}  // namespace lns
