// cuDNN's fused attention through the cudnn-frontend graph API (interface and layout:
// src/cuda/sdpa.h). Built when the headers are there (tools/fetch_cudnn.sh); the
// library itself, libcudnn.so.9, is loaded at run time (LNS_CUDNN_LIB, else the
// loader's search path), so a binary built with this file still runs where cuDNN is
// missing and only --attention=cudnn stops, saying so.
//
// One graph per (shape, scale, pass, backward algorithm), built on first use and kept:
// building runs cuDNN's heuristics and compiles its kernel (tens to hundreds of
// milliseconds), so it is logged. The deterministic backward (--attention=cudnn) needs
// a dP workspace of about 2 B Hq T^2 bytes (128 MiB at the 1B shape, 1 GiB at one
// 4096-token sequence of 32 heads) and falls back, with a warning, to the atomic one
// (--attention=cudnn_nondeterministic) where the library has no engine for it. The
// frontend throws as well as returning errors: both end as one UserError.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <glog/logging.h>

#include <cudnn_frontend.h>

#include "cuda/runtime.h"
#include "cuda/sdpa.h"
#include "lns/core/errors.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's dynamic-loading shim looks symbols up here
}

namespace lns::cuda {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Variant-pack ids of the graph's tensors.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

struct Library {
  std::string what;  // "cuDNN 9.13.0 (path)" or, on failure, empty
  std::string error;
  cudnnHandle_t handle = nullptr;
};

Library& library() {
  static Library lib = [] {
    Library l;
    // The frontend opens a CUDA runtime of its own by name, libcudart.so.12 first; this
    // binary's is .13, already loaded, so that one is reused.
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", "libcudart.so.13", /*overwrite=*/0);
    const char* env = std::getenv("LNS_CUDNN_LIB");
    const std::string name = env && *env ? env : "libcudnn.so.9";
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      l.error = "could not load " + name + " (" + (e ? e : "?") +
                "); set LNS_CUDNN_LIB to its path or add its folder to LD_LIBRARY_PATH";
      return l;
    }
    fe::cudnn_dlhandle = h;
    try {
      const int64_t v = fe::detail::get_backend_version();
      if (v < 90000) {
        l.error = name + " is cuDNN " + std::to_string(v) + "; its fused attention needs 9.0 or later";
        return l;
      }
      if (fe::detail::create_handle(&l.handle) != CUDNN_STATUS_SUCCESS) {
        l.handle = nullptr;
        l.error = "cudnnCreate failed (is the GPU visible?)";
        return l;
      }
    } catch (const std::exception& e) {  // a symbol or runtime the frontend could not find
      l.handle = nullptr;
      l.error = name + ": " + e.what();
      return l;
    }
    char path[4096] = "";
    if (void* sym = dlsym(h, "cudnnGetVersion")) {
      Dl_info info;
      if (dladdr(sym, &info) && info.dli_fname) snprintf(path, sizeof path, "%s", info.dli_fname);
    }
    const int64_t v = fe::detail::get_backend_version();
    l.what = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
             std::to_string(v % 100) + " (" + (path[0] ? path : name) + ")";
    return l;
  }();
  return lib;
}

// [B,H,T,D] as cuDNN names the dims, over memory laid out [B,T,H,D].
TensorAttr bthd(Graph& g, const char* name, Uid uid, const SdpaProblem& p, int64_t H) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({p.B, H, p.T, p.D})
                      .set_stride({p.T * H * p.D, p.D, H * p.D, 1}));
}
void as_bthd(const TensorAttr& t, const char* name, Uid uid, const SdpaProblem& p, int64_t H) {
  t->set_output(true).set_name(name).set_uid(uid).set_dim({p.B, H, p.T, p.D}).set_stride(
      {p.T * H * p.D, p.D, H * p.D, 1});
}
TensorAttr stats_tensor(Graph& g, const SdpaProblem& p) {  // [B,Hq,T,1] f32
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({p.B, p.Hq, p.T, 1})
                      .set_stride({p.Hq * p.T, p.T, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

struct Plan {
  std::shared_ptr<Graph> graph;
  int64_t workspace = 0;
};

std::string shape_name(const SdpaProblem& p) {
  return "B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) + " Hq=" + std::to_string(p.Hq) +
         " Hkv=" + std::to_string(p.Hkv) + " D=" + std::to_string(p.D);
}

// Makes and builds a graph (validate, lower, heuristics, compile): the error message on
// failure, whether the frontend returned it or threw it.
template <class Make>
std::string build(std::shared_ptr<Graph>& g, Make make) {
  try {
    g = make();
    auto e = g->build(library().handle, {fe::HeurMode_t::A});
    return e.is_good() ? "" : e.get_message();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::shared_ptr<Graph> forward_graph(const SdpaProblem& p) {
  auto g = new_graph();
  auto q = bthd(*g, "q", kQ, p, p.Hq), k = bthd(*g, "k", kK, p, p.Hkv), v = bthd(*g, "v", kV, p, p.Hkv);
  auto opts = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_causal_mask(true).set_attn_scale(p.scale);
  auto [o, stats] = g->sdpa(q, k, v, opts);
  as_bthd(o, "o", kO, p, p.Hq);
  stats->set_output(true).set_name("stats").set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(
      {p.B, p.Hq, p.T, 1}).set_stride({p.Hq * p.T, p.T, 1, 1});
  return g;
}

std::shared_ptr<Graph> backward_graph(const SdpaProblem& p, bool deterministic) {
  auto g = new_graph();
  auto q = bthd(*g, "q", kQ, p, p.Hq), k = bthd(*g, "k", kK, p, p.Hkv), v = bthd(*g, "v", kV, p, p.Hkv);
  auto o = bthd(*g, "o", kO, p, p.Hq), dout = bthd(*g, "dout", kDout, p, p.Hq);
  auto stats = stats_tensor(*g, p);
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("attention_backward")
                  .set_causal_mask(true)
                  .set_attn_scale(p.scale)
                  .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
  as_bthd(dq, "dq", kDq, p, p.Hq);
  as_bthd(dk, "dk", kDk, p, p.Hkv);
  as_bthd(dv, "dv", kDv, p, p.Hkv);
  return g;
}

const Plan& plan(const SdpaProblem& p, bool backward) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool, bool>;
  static std::mutex mu;
  // kept to the end of the process: its graphs hold cuDNN descriptors, which must not be
  // destroyed during static teardown (the frontend leaks its own statics for this)
  static auto& plans = *new std::map<Key, Plan>;
  std::lock_guard<std::mutex> lock(mu);
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &p.scale, 4);  // the scale is a constant inside the graph
  const Key key{p.B, p.T, p.Hq, p.Hkv, p.D, scale_bits, backward, backward && p.deterministic};
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  const Library& lib = library();
  if (!lib.handle) fail("--attention=cudnn: ", lib.error);
  const auto t0 = std::chrono::steady_clock::now();
  Plan pl;
  bool deterministic = backward && p.deterministic;
  std::string err = backward ? build(pl.graph, [&] { return backward_graph(p, deterministic); })
                             : build(pl.graph, [&] { return forward_graph(p); });
  if (!err.empty() && deterministic) {
    LOG(WARNING) << "cuDNN has no deterministic attention backward for " << shape_name(p) << " (" << err
                 << "): using its non-deterministic one";
    deterministic = false;
    err = build(pl.graph, [&] { return backward_graph(p, false); });
  }
  if (!err.empty())
    fail("--attention=cudnn: ", lib.what, " cannot run the ", backward ? "backward" : "forward", " for ",
         shape_name(p), ": ", err, "; use --attention=fused");
  try {
    if (auto e = pl.graph->get_workspace_size(pl.workspace); !e.is_good()) err = e.get_message();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (!err.empty()) fail("--attention=cudnn: workspace size: ", err);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  LOG(INFO) << "attention: " << lib.what << " " << (backward ? "backward" : "forward") << " plan for "
            << shape_name(p) << " built in " << static_cast<int>(ms) << " ms, workspace "
            << pl.workspace / (1 << 20) << " MiB" << (backward ? (deterministic ? ", deterministic" : ", atomic") : "");
  return plans.emplace(key, std::move(pl)).first->second;
}

void execute(const Plan& pl, std::unordered_map<int64_t, void*>& pack, CUstream_st* stream) {
  cudnnHandle_t h = library().handle;
  if (fe::detail::set_stream(h, stream) != CUDNN_STATUS_SUCCESS) fail("--attention=cudnn: cudnnSetStream failed");
  void* ws = pl.workspace > 0 ? scratch(Scratch::Attention, static_cast<size_t>(pl.workspace)) : nullptr;
  std::string err;
  try {
    if (auto e = pl.graph->execute(h, pack, ws); !e.is_good()) err = e.get_message();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (!err.empty()) fail("--attention=cudnn: execute: ", err);
}

}  // namespace

std::string sdpa_library(const std::string& flag) {
  const Library& lib = library();
  if (!lib.handle) fail(flag, ": ", lib.error);
  return lib.what;
}

void sdpa_forward(const SdpaProblem& p, const SdpaForward& t, CUstream_st* stream) {
  const Plan& pl = plan(p, false);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(t.q)}, {kK, const_cast<uint16_t*>(t.k)},
                                             {kV, const_cast<uint16_t*>(t.v)}, {kO, t.o}, {kStats, t.stats}};
  execute(pl, pack, stream);
}

void sdpa_backward(const SdpaProblem& p, const SdpaBackward& t, CUstream_st* stream) {
  const Plan& pl = plan(p, true);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<uint16_t*>(t.q)},   {kK, const_cast<uint16_t*>(t.k)},       {kV, const_cast<uint16_t*>(t.v)},
      {kO, const_cast<uint16_t*>(t.o)},   {kDout, const_cast<uint16_t*>(t.dout)}, {kStats, const_cast<float*>(t.stats)},
      {kDq, t.dq},                    {kDk, t.dk},                        {kDv, t.dv}};
  execute(pl, pack, stream);
}

}  // namespace lns::cuda
