// Helpers shared by the tests: deterministic random data, f64 finite differences
// and error measures relative to a tensor's largest entry.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lns/model/config.h"
#include "lns/core/errors.h"
#include "lns/model/param_set.h"
#include "lns/core/rng.h"
#include "lns/core/tensor.h"

namespace lns::test {

inline std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  const uint64_t key = rng_key(seed, "test");
  for (int64_t i = 0; i < n; ++i) v[i] = mean + std * normal_at(key, i);
  return v;
}

inline std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline Tensor view(std::vector<float>& v, Shape s) {
  EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel());
  Tensor t;
  t.data = v.data();
  t.dtype = DType::F32;
  t.shape = s;
  return t;
}

inline Tensor view(std::vector<int32_t>& v, Shape s) {
  Tensor t;
  t.data = v.data();
  t.dtype = DType::I32;
  t.shape = s;
  return t;
}

// max |got - want| / max(max |want|, floor): an error relative to the tensor's scale.
template <typename A, typename B>
double rel_max_err(const A* got, const B* want, int64_t n, double floor = 1e-30) {
  double err = 0.0, scale = floor;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return err / scale;
}

template <typename A, typename B>
void expect_close(const std::vector<A>& got, const std::vector<B>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double e = rel_max_err(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_LE(e, tol) << what << ": relative max error " << e;
}

// Central finite differences of a scalar f64 function at x, step h.
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f,
                                   std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// The message of the UserError f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

// A small GQA model with odd FFN and vocabulary sizes and 5 layers (Mix-LN: 2 post).
// The real (not padding) elements of a parameter stored as `info` says, in order: what
// compares a tensor-parallel shard or a GPU's padded storage (gemm_dim_align) with
// the CPU's unpadded one.
inline std::vector<float> real_elements(const ParamInfo& info, const float* data) {
  std::vector<float> out;
  const int64_t cols = info.shape.ndim > 1 ? info.shape[1] : 1;
  for (int64_t k = 0; k < info.shape.numel(); ++k) {
    int64_t li, lj;
    if (info.to_logical(k / cols, k % cols, &li, &lj)) out.push_back(data[k]);
  }
  return out;
}

inline LlamaConfig small_model(NormScheme s) {
  LlamaConfig c;
  c.vocab_size = 53, c.hidden_size = 32, c.intermediate_size = 45, c.num_layers = 5;
  c.num_heads = 4, c.num_kv_heads = 2, c.norm_scheme = s, c.post_layers = 2, c.init_std = 0.1f;
  if (s == NormScheme::Hybrid) c.layer_schemes = "lns,scale_res_pre_norm,deeppost,sandwich,*";
  return c;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- files and processes, for the tests of tools as a user runs them ----------------

inline std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

inline void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A fresh, empty directory under the test temp dir, unique per process.
inline std::string fresh_test_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/lns_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Every file and directory under `dir` (recursively), relative path -> its bytes
// ("<dir>" for directories): equal snapshots mean nothing was changed, added or removed.
inline std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string rel = std::filesystem::relative(e.path(), dir).string();
    out[rel] = e.is_directory() ? "<dir>" : slurp(e.path().string());
  }
  return out;
}

struct RunResult {
  int code;
  std::string out, err;
  // The last non-empty line of stderr: where a tool's one-line error goes.
  std::string last_line() const {
    std::string b = err;
    while (!b.empty() && b.back() == '\n') b.pop_back();
    const size_t nl = b.rfind('\n');
    return nl == std::string::npos ? b : b.substr(nl + 1);
  }
};

// Runs `binary args` through the shell; stdout and stderr captured.
inline RunResult run_binary(const std::string& binary, const std::string& args) {
  static int calls = 0;  // unique per process and call: ctest runs tests in parallel
  const std::string base = ::testing::TempDir() + "/lns_run_" + std::to_string(::getpid()) + "_" +
                           std::to_string(calls++);
  const std::string cmd = binary + " " + args + " >" + base + ".out 2>" + base + ".err";
  const int status = std::system(cmd.c_str());
  RunResult r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(base + ".out"),
              slurp(base + ".err")};
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

}  // namespace lns::test
