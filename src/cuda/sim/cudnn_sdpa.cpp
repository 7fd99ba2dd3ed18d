// The emulation build's stand-in for cuDNN's fused attention (src/cuda/sdpa.h; the
// real call is src/cuda/cudnn/sdpa_cudnn.cpp). As the cuBLASLt stand-in does, it
// refuses what the library refuses, then queues the computation on the stream as an
// op that declares what it reads and writes, so the emulator's stream and race
// checks see it like a kernel.
//
// What cuDNN requires of a bf16 causal attention with these layouts (its support table
// and the frontend's checks): head dim a multiple of 8, at most 128; Hq a multiple of
// Hkv; every tensor 16-byte aligned (the variant pack's alignment check); outputs that
// do not overlap the inputs. The numbers: scores and softmax in double from the bf16
// inputs, one rounding to bf16 per output; the backward recomputes P from the saved
// log-sum-exp and takes delta = rowsum(dO * O) from the given O, as the library does.
// Neither the library's kernel order nor its bf16 rounding of P is modelled, so the
// real library differs in the last bits (the tests' tolerance is the fused kernels').
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sdpa.h"
#include "cuda/sim/sim_api.h"
#include "lns/core/bf16.h"

namespace lns::cuda {
namespace {

using sim::fail;

struct Span {
  const void* p;
  size_t bytes;
  const char* name;
};

void check(const SdpaProblem& p, const char* call, std::initializer_list<Span> in, std::initializer_list<Span> out) {
  const std::string c = std::string("cuDNN ") + call + ": ";
  if (p.B < 1 || p.T < 1 || p.Hq < 1 || p.Hkv < 1 || p.D < 1)
    fail(c + "empty or negative dims B=" + std::to_string(p.B) + " T=" + std::to_string(p.T));
  if (p.D % 8 != 0 || p.D > 128)
    fail(c + "head dim " + std::to_string(p.D) + " is not supported for bf16 (a multiple of 8, at most 128)");
  if (p.Hq % p.Hkv != 0)
    fail(c + "Hq=" + std::to_string(p.Hq) + " is not a multiple of Hkv=" + std::to_string(p.Hkv));
  if (!(p.scale > 0.0f) || !std::isfinite(p.scale)) fail(c + "attention scale must be finite and positive");
  for (const auto* list : {&in, &out})
    for (const Span& s : *list) {
      if (!s.p) fail(c + s.name + " is null");
      if (reinterpret_cast<uintptr_t>(s.p) % 16 != 0)
        fail(c + s.name + " is not 16-byte aligned (the library's variant pack requires it)");
      sim::require_device_range(s.p, s.bytes, (c + s.name).c_str());
    }
  for (const Span& o : out)
    for (const auto* list : {&in, &out})
      for (const Span& s : *list) {
        if (&s == &o) continue;
        const auto a = reinterpret_cast<uintptr_t>(o.p), b = reinterpret_cast<uintptr_t>(s.p);
        if (a < b + s.bytes && b < a + o.bytes) fail(c + o.name + " overlaps " + s.name);
      }
}

float bf(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }

// Element (b, t, h, x) of a [B,T,H,D] tensor.
struct Bthd {
  const SdpaProblem& p;
  int64_t H;
  int64_t at(int64_t b, int64_t t, int64_t h, int64_t x) const { return ((b * p.T + t) * H + h) * p.D + x; }
};

// s[j] = scale * q(b,t,h) . k(b,j,hk) for j <= t
void scores(const SdpaProblem& p, const uint16_t* q, const uint16_t* k, int64_t b, int64_t t, int64_t h,
            std::vector<double>& s) {
  const Bthd Q{p, p.Hq}, K{p, p.Hkv};
  const int64_t hk = h / (p.Hq / p.Hkv);
  s.assign(t + 1, 0.0);
  for (int64_t j = 0; j <= t; ++j) {
    double d = 0.0;
    for (int64_t x = 0; x < p.D; ++x) d += double(bf(q, Q.at(b, t, h, x))) * bf(k, K.at(b, j, hk, x));
    s[j] = d * p.scale;
  }
}

void run_forward(const SdpaProblem& p, const SdpaForward& f) {
  const Bthd Q{p, p.Hq}, K{p, p.Hkv};
  std::vector<double> s, o(p.D);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t t = 0; t < p.T; ++t) {
        scores(p, f.q, f.k, b, t, h, s);
        double m = -INFINITY, l = 0.0;
        for (double x : s) m = std::max(m, x);
        std::fill(o.begin(), o.end(), 0.0);
        const int64_t hk = h / (p.Hq / p.Hkv);
        for (int64_t j = 0; j <= t; ++j) {
          const double e = std::exp(s[j] - m);
          l += e;
          for (int64_t x = 0; x < p.D; ++x) o[x] += e * bf(f.v, K.at(b, j, hk, x));
        }
        for (int64_t x = 0; x < p.D; ++x) f.o[Q.at(b, t, h, x)] = f32_to_bf16(static_cast<float>(o[x] / l));
        f.stats[(b * p.Hq + h) * p.T + t] = static_cast<float>(m + std::log(l));
      }
}

void run_backward(const SdpaProblem& p, const SdpaBackward& g) {
  const Bthd Q{p, p.Hq}, K{p, p.Hkv};
  std::vector<double> dk(p.B * p.T * p.Hkv * p.D, 0.0), dv(dk.size(), 0.0), dq(p.D), s;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t t = 0; t < p.T; ++t) {
        scores(p, g.q, g.k, b, t, h, s);
        const double lse = g.stats[(b * p.Hq + h) * p.T + t];
        const int64_t hk = h / (p.Hq / p.Hkv);
        double delta = 0.0;
        for (int64_t x = 0; x < p.D; ++x) delta += double(bf(g.dout, Q.at(b, t, h, x))) * bf(g.o, Q.at(b, t, h, x));
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j <= t; ++j) {
          const double pj = std::exp(s[j] - lse);
          double dp = 0.0;
          for (int64_t x = 0; x < p.D; ++x) dp += double(bf(g.dout, Q.at(b, t, h, x))) * bf(g.v, K.at(b, j, hk, x));
          const double ds = pj * (dp - delta) * p.scale;
          for (int64_t x = 0; x < p.D; ++x) {
            dq[x] += ds * bf(g.k, K.at(b, j, hk, x));
            dk[K.at(b, j, hk, x)] += ds * bf(g.q, Q.at(b, t, h, x));
            dv[K.at(b, j, hk, x)] += pj * bf(g.dout, Q.at(b, t, h, x));
          }
        }
        for (int64_t x = 0; x < p.D; ++x) g.dq[Q.at(b, t, h, x)] = f32_to_bf16(static_cast<float>(dq[x]));
      }
  for (size_t i = 0; i < dk.size(); ++i)
    g.dk[i] = f32_to_bf16(static_cast<float>(dk[i])), g.dv[i] = f32_to_bf16(static_cast<float>(dv[i]));
}

}  // namespace

std::string sdpa_library(const std::string& /*flag*/) { return "cuDNN stand-in (emulator, src/cuda/sim/cudnn_sdpa.cpp)"; }

void sdpa_forward(const SdpaProblem& p, const SdpaForward& f, CUstream_st* stream) {
  const size_t q = size_t(p.B * p.T * p.Hq * p.D) * 2, kv = size_t(p.B * p.T * p.Hkv * p.D) * 2,
               st = size_t(p.B * p.Hq * p.T) * 4;
  check(p, "sdpa forward", {{f.q, q, "Q"}, {f.k, kv, "K"}, {f.v, kv, "V"}}, {{f.o, q, "O"}, {f.stats, st, "Stats"}});
  sim::enqueue(
      stream, "cudnn sdpa forward",
      [=] {
        sim::declare_access(f.q, q, false), sim::declare_access(f.k, kv, false), sim::declare_access(f.v, kv, false);
        sim::declare_access(f.o, q, true), sim::declare_access(f.stats, st, true);
        run_forward(p, f);
      },
      __builtin_return_address(0));
}

void sdpa_backward(const SdpaProblem& p, const SdpaBackward& g, CUstream_st* stream) {
  const size_t q = size_t(p.B * p.T * p.Hq * p.D) * 2, kv = size_t(p.B * p.T * p.Hkv * p.D) * 2,
               st = size_t(p.B * p.Hq * p.T) * 4;
  check(p, "sdpa backward",
        {{g.q, q, "Q"}, {g.k, kv, "K"}, {g.v, kv, "V"}, {g.o, q, "O"}, {g.dout, q, "dO"}, {g.stats, st, "Stats"}},
        {{g.dq, q, "dQ"}, {g.dk, kv, "dK"}, {g.dv, kv, "dV"}});
  sim::enqueue(
      stream, "cudnn sdpa backward",
      [=] {
        for (const void* r : {static_cast<const void*>(g.q), static_cast<const void*>(g.o),
                              static_cast<const void*>(g.dout)})
          sim::declare_access(r, q, false);
        sim::declare_access(g.k, kv, false), sim::declare_access(g.v, kv, false);
        sim::declare_access(g.stats, st, false);
        sim::declare_access(g.dq, q, true), sim::declare_access(g.dk, kv, true), sim::declare_access(g.dv, kv, true);
        run_backward(p, g);
      },
      __builtin_return_address(0));
}

}  // namespace lns::cuda
