#!/usr/bin/env python3
"""PyTorch counterpart of lns_bench_kernels: memory bandwidth of a copy and of
the fused residual-add + RMSNorm, and bf16 GEMM throughput at the 1B model's
shapes, on one GPU.

    python3 tools/bench/bench_kernels_torch.py [--json PATH] [--flagfile configs/1b_lns.flags]
        [--tokens 2048,8192] [--iters 50] [--warmup 10] [--no-compile] [--device cuda|cpu]

Timing: CUDA events around each call, median over --iters calls after
--warmup untimed ones. Bandwidth counts bytes that must cross DRAM at least
once (every tensor is 32 MiB or more, the L2 is 50-60 MiB, so little is
served from cache):

  copy_<size>               dst.copy_(src): read + write = 2 x size bytes
  rmsnorm_fwd_<N>x<C>       r = res + delta; y = rms_norm(r, w) * scale (bf16):
                            reads res, delta, writes r, y = 4*N*C*2 bytes
                            (+ the C-wide gain, ignored)
  rmsnorm_bwd_<N>x<C>       reads dy, r (the saved residual out), dres (the
                            gradient arriving along the residual stream),
                            writes dx (the gradient of res and delta, one
                            tensor) = 4*N*C*2 bytes (+ per-row 1/rms in fp32
                            and the gain gradient, ignored). Timed as
                            torch.autograd.grad of the saved graph
                            (retain_graph), so the forward is not included.
  rmsnorm_fwdbwd_<N>x<C>    one forward + one backward, 8*N*C*2 bytes
  gemm_<name>_<M>x<N>x<K>   x[M,K] @ W[N,K]^T in bf16 (fp32 accumulate),
                            2*M*N*K FLOP. Shapes of configs/1b_lns.flags:
                            q/k/v/o M x C x C, gate/up M x F x C, down
                            M x C x F, lm_head M x V x C. M (tokens) is
                            micro_batch_size * seq_len of the flagfile
                            (2048 for 1b_lns) and 8192, unless --tokens.

Norm figures come in two variants: "eager" (PyTorch's kernels one after
another) and "compile" (torch.compile, which fuses them with Triton).

--json PATH writes {"impl": "torch", "device", "torch", "results": [records]},
a record being {"name", "metric" ("GB/s" or "TFLOP/s"), "value", "ms",
"bytes" or "flops", "variant" (norms), "shape"}; tools/device/summarize.py
pairs records with lns_bench_kernels's by name. Without a GPU (and without
--device cpu, a tiny smoke run) it prints "no CUDA device" and exits 0.
"""

import argparse
import json
import os
import statistics
import sys

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def read_flags(path, flags=None, depth=0):
    """Minimal gflags flagfile reader: --name=value lines, '#' comments, nested --flagfile."""
    flags = {} if flags is None else flags
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(REPO_ROOT, path)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("--"):
                continue
            name, _, value = line[2:].partition("=")
            if name == "flagfile" and depth < 10:
                read_flags(value, flags, depth + 1)
            else:
                flags[name] = value
    return flags


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--flagfile", default="configs/1b_lns.flags", help="model whose GEMM shapes are timed")
    ap.add_argument("--tokens", default="", help="comma-separated GEMM M values (default: "
                    "micro_batch_size*seq_len of the flagfile, and 8192)")
    ap.add_argument("--norm_shapes", default="8192x2048,8192x4096", help="N x C of the norm benchmarks")
    ap.add_argument("--copy_mib", type=int, default=1024, help="size of the large copy, MiB")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--scale", type=float, default=0.2, help="LNS output scale 1/sqrt(l) (0.2 = layer 25)")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile variants")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a tiny smoke run of the code paths (figures meaningless)")
    return ap.parse_args(argv)


class Timer:
    """Median milliseconds of fn() over iters calls after warmup calls."""

    def __init__(self, torch, device, iters, warmup):
        self.torch, self.device, self.iters, self.warmup = torch, device, iters, warmup

    def __call__(self, fn):
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
            ms = []
            for _ in range(self.iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ms.append(a.elapsed_time(b))
            return statistics.median(ms)
        import time
        ms = []
        for _ in range(self.iters):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ms)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("bench_kernels_torch: PyTorch is not installed; nothing to do")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_kernels_torch: no CUDA device; nothing to do")
        return 0
    dev = torch.device(args.device)
    smoke = args.device == "cpu"
    if smoke:  # tiny sizes: this only checks that the code runs
        args.iters, args.warmup, args.copy_mib = 3, 1, 4
        args.norm_shapes = "64x256"
    timer = Timer(torch, args.device, args.iters, args.warmup)
    bf16 = torch.bfloat16
    results = []

    def record(name, metric, value, ms, shape, **extra):
        r = {"name": name, "metric": metric, "value": round(value, 2), "ms": round(ms, 4), "shape": shape}
        r.update(extra)
        results.append(r)
        var = f" [{r['variant']}]" if r.get("variant") else ""
        print(f"{name:<36s}{var:<10s} {value:10.1f} {metric:<8s} {ms * 1e3:10.1f} us", flush=True)

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {gpu}; median of {args.iters} after {args.warmup} warm-up calls",
          flush=True)

    # ---- (a) copy bandwidth -------------------------------------------------------
    norm_shapes = [tuple(int(v) for v in s.split("x")) for s in args.norm_shapes.split(",") if s]
    copies = [(f"copy_{args.copy_mib}MiB", args.copy_mib * 2**20 // 2)]
    copies += [(f"copy_{n}x{c}", n * c) for n, c in norm_shapes]
    for name, numel in copies:
        src = torch.randn(numel, device=dev).to(bf16)
        dst = torch.empty_like(src)
        nbytes = 2 * src.numel() * src.element_size()
        ms = timer(lambda: dst.copy_(src))
        record(name, "GB/s", nbytes / ms / 1e6, ms, [numel], bytes=nbytes)
        del src, dst

    # ---- (b) residual add + RMSNorm (+ LNS scale), forward and backward -----------
    scale, eps = args.scale, args.eps

    def add_norm(res, delta, w):
        r = res + delta
        return r, F.rms_norm(r, (r.shape[-1],), w, eps) * scale

    variants = [("eager", add_norm)]
    if args.compile:
        variants.append(("compile", torch.compile(add_norm, dynamic=False)))
    for n, c in norm_shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        res = torch.randn(n, c, device=dev, generator=g).to(bf16)
        delta = torch.randn(n, c, device=dev, generator=g).to(bf16)
        w = (1 + 0.1 * torch.randn(c, device=dev, generator=g)).to(bf16)
        dres = torch.randn(n, c, device=dev, generator=g).to(bf16)
        dy = torch.randn(n, c, device=dev, generator=g).to(bf16)
        io = 4 * n * c * 2
        shape = [n, c]
        for vname, fn in variants:
            try:
                with torch.no_grad():
                    ms = timer(lambda: fn(res, delta, w))
                record(f"rmsnorm_fwd_{n}x{c}", "GB/s", io / ms / 1e6, ms, shape, bytes=io, variant=vname)
                rg, dg, wg = (t.detach().requires_grad_() for t in (res, delta, w))
                r, y = fn(rg, dg, wg)
                ms = timer(lambda: torch.autograd.grad((r, y), (rg, dg, wg), (dres, dy), retain_graph=True))
                record(f"rmsnorm_bwd_{n}x{c}", "GB/s", io / ms / 1e6, ms, shape, bytes=io, variant=vname)
                del r, y

                def fwd_bwd():
                    r2, y2 = fn(rg, dg, wg)
                    torch.autograd.grad((r2, y2), (rg, dg, wg), (dres, dy))

                ms = timer(fwd_bwd)
                record(f"rmsnorm_fwdbwd_{n}x{c}", "GB/s", 2 * io / ms / 1e6, ms, shape, bytes=2 * io,
                       variant=vname)
            except Exception as e:  # a torch.compile failure must not cost the other figures
                print(f"rmsnorm {n}x{c} [{vname}]: failed: {type(e).__name__}: {e}", flush=True)
        del res, delta, w, dres, dy

    # ---- (c) GEMMs at the model's shapes ------------------------------------------
    flags = read_flags(args.flagfile)
    C = int(flags.get("hidden_size", 768))
    F_ = int(flags.get("intermediate_size", 2048))
    V = int(flags.get("vocab_size", 32000))
    H = int(flags.get("num_heads", 12))
    KVH = int(flags.get("num_kv_heads", H))
    KV = KVH * (C // H)
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    else:
        tokens = [int(flags.get("micro_batch_size", 8)) * int(flags.get("seq_len", 256)), 8192]
        tokens = sorted(set(tokens))
    if smoke:
        tokens, C, F_, V, KV = [64], 128, 256, 512, 128
    gemms = [("qkvo", C, C), ("gate_up", F_, C), ("down", C, F_), ("lm_head", V, C)]
    if KV != C:
        gemms.insert(1, ("kv", KV, C))
    print(f"GEMM shapes from {args.flagfile}: hidden {C}, intermediate {F_}, vocab {V}, heads {H}/{KVH}; "
          f"M = {tokens}", flush=True)
    for m in tokens:
        x_big = torch.randn(m, max(C, F_), device=dev).to(bf16)
        for gname, n_out, k in gemms:
            x = x_big[:, :k].contiguous()
            wt = (torch.randn(n_out, k, device=dev) * k ** -0.5).to(bf16)
            flop = 2 * m * n_out * k
            ms = timer(lambda: torch.matmul(x, wt.t()))
            record(f"gemm_{gname}_{m}x{n_out}x{k}", "TFLOP/s", flop / ms / 1e9, ms, [m, n_out, k], flops=flop)
            del x, wt
        del x_big

    if args.json:
        out = {"impl": "torch", "device": gpu, "torch": torch.__version__, "iters": args.iters,
               "warmup": args.warmup, "flagfile": args.flagfile, "results": results}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {len(results)} figures to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
