#!/usr/bin/env python3
"""Times full training steps of the PyTorch model (tools/reference/llama_torch.py)
on synthetic tokens: the PyTorch counterpart of lns_bench_step (bench_step.cpp).

    python3 tools/bench/bench_step_torch.py --flagfile=configs/tiny_lns.flags \
        [--hidden_size=512 --num_layers=8 ...] [--steps 10 --warmup 2] \
        [--device cpu|cuda] [--dtype float32|bfloat16] [--threads N] [--compile]

Model and training flags are read as gflags: --flagfile (lines --name=value,
'#' comments, nested --flagfile allowed) then command-line overrides, later
wins; defaults are the C++ ones. Flags the benchmark does not use (data paths,
lr schedule, eval, ...) are accepted and ignored; an unknown flag name is an
error. --steps / --warmup here are the timed / untimed step counts (a
flagfile's --steps, the training length, is ignored); --bench_steps /
--bench_warmup are accepted as aliases.

One step = for each of global_batch_size / micro_batch_size micro-batches:
forward + mean cross-entropy (scaled by 1 / micro-batches) + backward; then
gradient-norm clipping (if grad_clip > 0), torch.optim.AdamW (lr, beta1, beta2,
adam_eps; weight_decay on matrices only, as the C++ optimizer) and zero_grad.
Tokens are uniform random ids (fixed seed), generated on the device before
timing, a different set per micro-batch, reused across steps.

--dtype bfloat16 keeps parameters, gradients and optimizer state in bf16
(pure bf16); --autocast runs float32 parameters under torch.autocast(bfloat16).
Output: config summary, ms/step (median, min, max and mean), tokens/s, GFLOP/s (same
FLOP count as the C++ bench), then `RESULT {json}` on one line. With
--device cuda also the peak memory (torch.cuda.max_memory_allocated over the
whole run, GiB) and MFU = flops_per_token x tokens/s / peak, the peak being
--peak_tflops (else a flagfile's --peak_tflops, else 989: H100 SXM dense
bf16); both go into the RESULT json as peak_mem_gib and mfu. Every step is
bracketed by torch.cuda.synchronize(), so the times are the GPU's.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.dont_write_bytecode = True
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools", "reference"))
import llama_torch  # noqa: E402

# gflags of the C++ stack with their defaults (src/model/model_flags.cpp,
# src/train/train_flags.cpp); the type is taken from the default.
FLAG_DEFAULTS = {
    # model
    "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_layers": 12,
    "num_heads": 12, "num_kv_heads": 12, "rope_theta": 10000.0, "norm_eps": 1e-5,
    "norm_type": "rmsnorm", "norm_scheme": "lns", "post_layers": 0, "tie_embeddings": False,
    "init_std": 0.02, "embed_init_std": 0.02,
    # training
    "data": "random", "val_data": "", "data_mode": "packed", "seq_len": 256,
    "micro_batch_size": 8, "global_batch_size": 8, "seed": 1234, "steps": 100, "lr": 1e-3,
    "min_lr_ratio": 0.1, "warmup_steps": 0, "beta1": 0.9, "beta2": 0.999, "adam_eps": 1e-8,
    "weight_decay": 0.0, "grad_clip": 1.0, "eval_every": 0, "eval_tokens": 65536,
    "log_every": 10, "out_dir": "", "peak_tflops": 0.0, "init_from": "", "dump_step_state": "",
    "device": "cpu",  # a flagfile's --device; the command line's --device decides
    "attention": "auto",  # lns's attention kernel choice: PyTorch always runs SDPA
}
MODEL_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "rope_theta", "norm_eps", "norm_type", "norm_scheme",
              "post_layers", "tie_embeddings", "init_std", "embed_init_std", "seq_len",
              "micro_batch_size")
DEFAULT_PEAK_TFLOPS = 989.0  # H100 SXM, dense bf16 (H200: the same)
TRUE = ("1", "true", "t", "yes", "y")
FALSE = ("0", "false", "f", "no", "n")


def _convert(name, value):
    default = FLAG_DEFAULTS[name]
    if isinstance(default, bool):
        v = value.lower()
        if v in TRUE:
            return True
        if v in FALSE:
            return False
        raise ValueError(f"--{name}: bad boolean {value!r}")
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    return value


def parse_gflag(arg, flags, depth=0):
    """Apply one '--name=value' / '--name' / '--noname' token to flags."""
    if not arg.startswith("-"):
        raise ValueError(f"not a flag: {arg!r}")
    body = arg.lstrip("-")
    name, eq, value = body.partition("=")
    if name == "flagfile":
        if not eq:
            raise ValueError("--flagfile needs =PATH")
        read_flagfile(value, flags, depth + 1)
        return
    if name not in FLAG_DEFAULTS:
        if not eq and name.startswith("no") and isinstance(FLAG_DEFAULTS.get(name[2:]), bool):
            flags[name[2:]] = False
            return
        raise ValueError(f"unknown flag --{name}")
    if not eq:
        if isinstance(FLAG_DEFAULTS[name], bool):
            flags[name] = True
            return
        raise ValueError(f"--{name} needs a value (--{name}=VALUE)")
    flags[name] = _convert(name, value)


def read_flagfile(path, flags, depth=0):
    if depth > 10:
        raise ValueError("--flagfile nesting too deep")
    if not os.path.isabs(path) and not os.path.exists(path):
        alt = os.path.join(REPO_ROOT, path)
        path = alt if os.path.exists(alt) else path
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parse_gflag(line, flags, depth)


def bench_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--steps", "--bench_steps", dest="steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", "--bench_warmup", dest="warmup", type=int, default=2,
                    help="untimed steps first")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--autocast", action="store_true",
                    help="float32 parameters, forward/backward under torch.autocast(bfloat16)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch default)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--fused_adam", action="store_true", help="AdamW(fused=True) (CUDA)")
    ap.add_argument("--pad_ffn", type=int, default=0, metavar="N",
                    help="build the FFN with intermediate_size rounded up to a multiple of N (lns pads "
                         "its device FFN to a multiple of 64: the fair peer); FLOPs and MFU still count "
                         "the config's size, as lns does")
    ap.add_argument("--peak_tflops", type=float, default=None,
                    help="peak TFLOP/s of the device for MFU (CUDA; default: the flagfile's "
                         "--peak_tflops if > 0, else %g)" % DEFAULT_PEAK_TFLOPS)
    # Everything else is a gflag (--flagfile=..., --hidden_size=..., ...).
    args, rest = ap.parse_known_args(argv)
    flags = dict(FLAG_DEFAULTS)
    i = 0
    while i < len(rest):
        tok = rest[i]
        # allow '--name value' for non-boolean gflags too
        name = tok.lstrip("-").partition("=")[0]
        takes_value = name == "flagfile" or (name in FLAG_DEFAULTS
                                             and not isinstance(FLAG_DEFAULTS[name], bool))
        if "=" not in tok and takes_value and i + 1 < len(rest):
            tok = f"--{name}={rest[i + 1]}"
            i += 1
        try:
            parse_gflag(tok, flags)
        except (ValueError, OSError) as e:
            ap.error(str(e))
        i += 1
    return args, flags


def flops_per_token(cfg):
    """Trainer::flops_per_token (src/train/trainer.cpp), term for term: 6 FLOPs
    per token for every matmul parameter (q/o: C x QD, k/v: C x KD, gate/up/down:
    C x F per layer, and the V x C head, tied or not; the embedding lookup is
    free) plus attention scores and values, 12 L C T (causal mask not subtracted)."""
    C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_layers"]
    head_dim = C // cfg["num_heads"]
    QD, KD = cfg["num_heads"] * head_dim, cfg["num_kv_heads"] * head_dim
    per_layer = 2 * C * QD + 2 * C * KD + 3 * C * F
    matmul_params = L * per_layer + cfg["vocab_size"] * C
    return 6 * matmul_params + 12 * L * C * cfg["seq_len"]


def main(argv=None):
    args, flags = bench_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1 or args.warmup < 0:
        sys.exit("bench_step_torch: --steps must be >= 1 and --warmup >= 0")
    B, G, T = flags["micro_batch_size"], flags["global_batch_size"], flags["seq_len"]
    if B <= 0 or G <= 0 or G % B:
        sys.exit("bench_step_torch: --global_batch_size must be a positive multiple of --micro_batch_size")
    accum = G // B
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_step_torch: --device cuda but CUDA is not available")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    dev = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    cfg = {k: flags[k] for k in MODEL_KEYS}
    fpt = flops_per_token(cfg)
    if args.pad_ffn < 0:
        sys.exit("bench_step_torch: --pad_ffn must be >= 0")
    if args.pad_ffn > 1:
        cfg["intermediate_size"] = -(-cfg["intermediate_size"] // args.pad_ffn) * args.pad_ffn
    torch.manual_seed(flags["seed"])
    model = llama_torch.LlamaModel(cfg, dtype=dtype, device=dev, seed=flags["seed"])
    model.train()
    n_params = llama_torch.num_params(model)
    step_model = torch.compile(model) if args.compile else model

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt_kw = dict(lr=flags["lr"], betas=(flags["beta1"], flags["beta2"]), eps=flags["adam_eps"])
    if args.fused_adam:
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": flags["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    gen = torch.Generator(device="cpu").manual_seed(flags["seed"] + 1)
    batches = []
    for _ in range(accum):
        tok = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=gen, dtype=torch.int64)
        batches.append((tok[:, :-1].contiguous().to(dev), tok[:, 1:].contiguous().to(dev)))

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    ac_dtype = torch.bfloat16 if args.autocast else None

    def train_step():
        loss_sum = 0.0
        for inputs, targets in batches:
            with torch.autocast(args.device, dtype=ac_dtype, enabled=args.autocast):
                logits = step_model(inputs)
                loss = llama_torch.loss(logits, targets)
            (loss / accum).backward()
            loss_sum += loss.detach()
        if flags["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), flags["grad_clip"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum / accum

    prec = args.dtype + (" + autocast bf16" if args.autocast else "")
    print(f"config: hidden {cfg['hidden_size']}, layers {cfg['num_layers']}, heads "
          f"{cfg['num_heads']}/{cfg['num_kv_heads']}, intermediate {cfg['intermediate_size']}, "
          f"vocab {cfg['vocab_size']}, seq {T}, batch {G} (micro {B}), {n_params / 1e6:.2f}M "
          f"parameters, {cfg['norm_type']}/{cfg['norm_scheme']}", flush=True)
    print(f"torch {torch.__version__}: device {args.device}, {prec}, threads "
          f"{torch.get_num_threads()}, compile {args.compile}, sdpa enable_gqa "
          f"{llama_torch.SDPA_GQA}", flush=True)

    ms = []
    last_loss = float("nan")
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = train_step()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            ms.append(dt)
        last_loss = float(loss)
    median = statistics.median(ms)
    mean = statistics.fmean(ms)
    tokens = G * T
    tps = tokens / (median / 1e3)
    gflops = fpt * tps / 1e9
    print(f"step: median {median:.1f} ms (min {min(ms):.1f}, max {max(ms):.1f}), mean {mean:.1f} ms over "
          f"{len(ms)} steps | "
          f"{tps:.0f} tokens/s | {gflops:.1f} GFLOP/s | last loss {last_loss:.4f}")
    result = {"impl": "torch", "device": args.device, "dtype": args.dtype, "autocast": args.autocast,
              "compile": args.compile, "threads": torch.get_num_threads(),
              "intermediate_size": cfg["intermediate_size"], "fused_adam": args.fused_adam,
              "median_ms": round(median, 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3),
              "mean_ms": round(mean, 3),
              "tokens_per_s": round(tps, 1), "gflops": round(gflops, 2), "steps": len(ms),
              "params": n_params, "hidden_size": cfg["hidden_size"], "num_layers": cfg["num_layers"],
              "seq_len": T, "global_batch_size": G, "micro_batch_size": B}
    if args.device == "cuda":
        peak = args.peak_tflops or flags["peak_tflops"] or DEFAULT_PEAK_TFLOPS
        peak_mem = torch.cuda.max_memory_allocated(dev) / 2**30
        mfu = fpt * tps / (peak * 1e12)
        print(f"cuda: {torch.cuda.get_device_name(dev)} | peak memory {peak_mem:.2f} GiB | "
              f"MFU {100 * mfu:.1f}% of {peak:g} TFLOP/s")
        result.update(gpu=torch.cuda.get_device_name(dev), peak_mem_gib=round(peak_mem, 3),
                      mfu=round(mfu, 4), peak_tflops=peak)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
