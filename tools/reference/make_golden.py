#!/usr/bin/env python3
"""Generate golden safetensors files for the C++ LLaMA stack from the float64
PyTorch reference in llama_reference.py.

    python3 tools/reference/make_golden.py [--out_dir DIR] [--check]

One file per (norm_type, norm_scheme): <norm_type>_<norm_scheme>.safetensors
holding the f32 weights (HF names), inputs/targets (I32), logits (F32),
loss (F32, 0-dim) and grad.<name> (F32) for every weight.
--check regenerates in memory and compares against the files in --out_dir
(bit-exact) instead of writing.
"""

import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.dont_write_bytecode = True  # keep tools/reference/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GENERATOR = "tools/reference/make_golden.py"
NUM_IGNORED = 3  # target positions set to -100


def case_config(norm_type, norm_scheme):
    layernorm = norm_type == "layernorm"
    routed = norm_scheme in ref.ROUTED_SCHEMES + ref.CORRECTED_SCHEMES
    return {
        "vocab_size": 53,
        "hidden_size": 36,
        "intermediate_size": 45,
        "num_layers": 4 if routed else 3,  # mono / mono_reverse route 0-based layer 3
        "num_heads": 6,
        "num_kv_heads": 2,
        "rope_theta": 500.0 if layernorm else 10000.0,
        "norm_eps": 1e-5,
        "norm_type": norm_type,
        "norm_scheme": norm_scheme,
        "post_layers": 1,
        "tie_embeddings": layernorm,
        "seq_len": 7,
        "micro_batch_size": 2,
    } | ({"layer_schemes": HYBRID_PATTERNS[norm_type]} if norm_scheme == "hybrid" else {})


# hybrid golden files: Pre-LN, Post-LN, Pre-LN (the "every other layer" pattern, cut
# short by the 3 layers) with rmsnorm; sandwich then deeppost with layernorm.
HYBRID_PATTERNS = {"rmsnorm": "pre,post,*", "layernorm": "sandwich:1,deeppost"}


def cases():
    """(seed index, norm_type, norm_scheme): the seven schemes first, then the extra
    ones, so that adding a scheme never changes an existing file's seed."""
    idx = 0
    for schemes in (ref.NORM_SCHEMES, ref.EXTRA_SCHEMES, ref.ROUTED_SCHEMES, ref.CORRECTED_SCHEMES):
        for norm_type in ref.NORM_TYPES:
            for norm_scheme in schemes:
                yield idx, norm_type, norm_scheme
                idx += 1


def make_case(cfg, seed):
    """Returns (tensors dict for the file, float64 weights, inputs, targets)."""
    torch.manual_seed(seed)
    w32 = ref.init_weights(cfg)
    B, T, V = cfg["micro_batch_size"], cfg["seq_len"], cfg["vocab_size"]
    inputs = torch.randint(0, V, (B, T), dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), dtype=torch.int32)
    ignored = torch.randperm(B * T)[:NUM_IGNORED]
    targets.view(-1)[ignored] = ref.IGNORE_INDEX

    W = ref.load_weights(cfg, w32)  # float64 copies of exactly the f32 values
    noise = route_noise(cfg, W, inputs)
    logits, loss, grads = ref.forward_backward(cfg, W, inputs, targets, noise)

    out = dict(w32)
    for i, g in noise.items():  # not a weight name: --init_from and load_weights skip it
        out[f"gate_noise.{i}"] = g.to(torch.float32).contiguous()
    out["inputs"] = inputs.contiguous()
    out["targets"] = targets.contiguous()
    out["logits"] = logits.to(torch.float32).contiguous()
    out["loss"] = loss.to(torch.float32).reshape(())
    for name, g in grads.items():
        out["grad." + name] = g.to(torch.float32).contiguous()
    return out, W, inputs, targets, loss, noise


ROUTE_MARGIN = 0.5  # the chosen path's noisy logit leads by at least this much


def route_noise(cfg, W, inputs):
    """Gumbel noise [B, 2] (float32 values) for each routed layer, drawn from the torch
    generator and then adjusted so that sequence b takes path b % 2: both paths, and the
    straight-through gradient of both gate entries, are checked. Routed layers are
    handled in order, each with the gates of the earlier ones fixed."""
    noise = {}
    for i in range(cfg["num_layers"]):
        if not ref.block_plan(cfg, i).get("router"):
            continue
        trace = []
        with torch.no_grad():
            ref.forward(cfg, W, inputs, noise, trace)
        logits = trace[len(noise)]  # this layer's router logits [B, 2]
        u = torch.rand(logits.shape, dtype=torch.float32).clamp_min(1e-6)
        g = (-torch.log(-torch.log(u))).to(ref.DTYPE)
        for b in range(logits.shape[0]):
            want, other = b % 2, 1 - b % 2
            lead = (logits[b, want] + g[b, want]) - (logits[b, other] + g[b, other])
            if lead < ROUTE_MARGIN:
                g[b, want] += ROUTE_MARGIN - lead
        noise[i] = g.to(torch.float32).to(ref.DTYPE)  # exactly the values the file holds
    return noise


def finite_difference_check(cfg, W, inputs, targets, names, h=1e-5, rtol=1e-6, noise=None):
    """Compare autograd vs central differences (float64) at the largest-|grad|
    entry of each named weight. Asserts relative agreement within rtol. A routed gate is
    piecewise constant, so its straight-through gradient is no derivative: autograd runs
    without it here (the golden gradients keep it)."""
    _, _, grads = ref.forward_backward(cfg, W, inputs, targets, noise, straight_through=False)
    worst = 0.0
    with torch.no_grad():
        for name in names:
            g = grads[name]
            flat = int(g.abs().argmax())
            w = W[name].view(-1)
            orig = w[flat].item()
            w[flat] = orig + h
            lp = ref.loss_fn(ref.forward(cfg, W, inputs, noise), targets).item()
            w[flat] = orig - h
            lm = ref.loss_fn(ref.forward(cfg, W, inputs, noise), targets).item()
            w[flat] = orig
            fd = (lp - lm) / (2 * h)
            ag = g.view(-1)[flat].item()
            rel = abs(fd - ag) / max(abs(ag), 1e-12)
            worst = max(worst, rel)
            assert rel < rtol, f"FD check failed for {name}[{flat}]: autograd {ag!r} vs FD {fd!r} (rel {rel:.2e})"
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out_dir", default=os.path.join(REPO_ROOT, "tests", "golden"))
    ap.add_argument("--check", action="store_true",
                    help="compare regenerated data with existing files instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order -> reproducible f32 rounding
    os.makedirs(args.out_dir, exist_ok=True)

    failures = 0
    for idx, norm_type, norm_scheme in cases():
        cfg = case_config(norm_type, norm_scheme)
        seed = 1000 + idx
        tensors, W, inputs, targets, loss, noise = make_case(cfg, seed)
        meta = {"config": json.dumps(cfg), "generator": GENERATOR, "seed": str(seed)}
        path = os.path.join(args.out_dir, f"{norm_type}_{norm_scheme}.safetensors")

        # Sanity: autograd vs central finite differences (float64).
        fd_names = ["model.embed_tokens.weight",
                    "model.layers.0.self_attn.q_proj.weight",
                    "model.layers.1.self_attn.k_proj.weight",
                    "model.layers.2.mlp.down_proj.weight",
                    "model.norm.weight"]
        fd_names += [n for n in W if n.startswith("model.layers.0.") and ("norm" in n or "raw_scaling_factor" in n)]
        # The routed layer: every norm and the shared weights, both paths. Not the
        # router: the hard gate makes the loss piecewise constant in it (its gradient is
        # the straight-through estimate, checked against autograd of the same formula).
        fd_names += [n for n in W if n.startswith("model.layers.3.") and ("norm" in n or "proj" in n)
                     and norm_scheme in ref.ROUTED_SCHEMES + ref.CORRECTED_SCHEMES]
        if norm_type == "layernorm":
            fd_names.append("model.norm.bias")
        else:
            fd_names.append("lm_head.weight")
        fd_worst = finite_difference_check(cfg, W, inputs, targets, fd_names, noise=noise)

        if args.check:
            old = load_file(path)
            with safe_open(path, "pt") as f:
                old_meta = f.metadata()
            bad = [k for k in set(old) | set(tensors)
                   if k not in old or k not in tensors or old[k].dtype != tensors[k].dtype
                   or old[k].shape != tensors[k].shape or not torch.equal(old[k], tensors[k])]
            if old_meta != meta:
                bad.append("__metadata__")
            status = "OK" if not bad else f"MISMATCH {sorted(bad)[:5]}"
            failures += bool(bad)
        else:
            save_file(tensors, path, metadata=meta)
            status = "written"
        size = os.path.getsize(path)
        print(f"{norm_type:9s} {norm_scheme:11s} loss={loss.item():.9f} "
              f"fd_rel_err_max={fd_worst:.1e} size={size} B  {os.path.relpath(path, REPO_ROOT)} {status}")
    if failures:
        sys.exit(f"{failures} golden file(s) differ")


if __name__ == "__main__":
    main()
