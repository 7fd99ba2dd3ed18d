#include "lns/cpu/cpu_info.h"

#include <cblas.h>

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <string>

namespace lns {

std::string cpu_blas_info() {
  return absl::StrCat(absl::StripAsciiWhitespace(OPENBLAS_VERSION), ", kernel ", openblas_get_corename(), ", ",
                      openblas_get_num_threads(), " threads");
}

std::string cpu_blas_warning() {
  const std::string core = openblas_get_corename();
  if (core != "Prescott" && core != "Core2" && core != "Nehalem") return "";
  __builtin_cpu_init();
  const char* best = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (!best) return "";
  return absl::StrCat("OpenBLAS uses its generic '", core, "' kernel on a CPU with ",
                      best == std::string("SkylakeX") ? "AVX-512" : "AVX2", "; export OPENBLAS_CORETYPE=",
                      best, " (launch/env.sh does) for about twice the speed");
}

}  // namespace lns
