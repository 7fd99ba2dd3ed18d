#!/usr/bin/env python3
"""Check a Hugging Face export against lns_train's own forward pass.

`lns_convert export-hf` writes a LlamaForCausalLM directory (config.json +
model.safetensors). This script

  1. runs `lns_train --init_from=HFDIR/model.safetensors --dump_step_state=...`
     with the model shape taken from config.json (pre-norm RMSNorm LLaMA), which
     writes the inputs and logits of one random micro-batch;
  2. runs `transformers.LlamaForCausalLM` (float32, eager attention, offline, no
     custom code) on the same inputs;
  3. compares the logits: max |diff| and max |diff| / max |logit of lns_train|.

Exit status: 0 if the relative difference is <= --tol, 1 if it is larger, 2 on a
setup error (bad config, lns_train failure, missing weights).

Usage (from the repository root):

    python3 tools/reference/check_hf_export.py --hf_dir /tmp/export \
        [--lns_train ./build/lns_train] [--seq_len 32] [--batch 2] [--seed 1] [--tol 1e-4]

Needs torch, numpy, safetensors and transformers (`pip install transformers`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

# Offline before transformers is imported: never touch the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def die(msg, code=2):
    print(f"check_hf_export: ERROR: {msg}", file=sys.stderr)
    sys.exit(code)


def fmt_num(x):
    """Shortest round-trip text for a float (gflags parses it as a double)."""
    return repr(float(x))


def read_config(hf_dir):
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        die(f"{path} not found")
    if not os.path.isfile(os.path.join(hf_dir, "model.safetensors")):
        die(f"{os.path.join(hf_dir, 'model.safetensors')} not found "
            "(sharded exports are not supported by this check)")
    with open(path) as f:
        cfg = json.load(f)

    def need(key):
        if key not in cfg:
            die(f"{path}: missing key {key!r}")
        return cfg[key]

    if cfg.get("model_type", "llama") != "llama":
        die(f"{path}: model_type is {cfg.get('model_type')!r}, expected 'llama'")
    if cfg.get("hidden_act", "silu") != "silu":
        die(f"{path}: hidden_act {cfg.get('hidden_act')!r} is not supported (silu only)")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key, False):
            die(f"{path}: {key}=true is not supported by lns_train")

    # rope_theta: top level (transformers 4.x) or inside rope_parameters (5.x).
    rope_theta = cfg.get("rope_theta")
    rope_params = cfg.get("rope_parameters")
    if isinstance(rope_params, dict):
        if rope_params.get("rope_type", "default") != "default":
            die(f"{path}: rope_parameters {rope_params} is not supported")
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta")
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling not in (None, {}) and not (
            isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default"):
        die(f"{path}: rope_scaling {rope_scaling} is not supported")
    if rope_theta is None:
        rope_theta = 10000.0  # transformers' LlamaConfig default

    m = {
        "vocab_size": int(need("vocab_size")),
        "hidden_size": int(need("hidden_size")),
        "intermediate_size": int(need("intermediate_size")),
        "num_layers": int(need("num_hidden_layers")),
        "num_heads": int(need("num_attention_heads")),
        "num_kv_heads": int(cfg.get("num_key_value_heads") or need("num_attention_heads")),
        "rope_theta": float(rope_theta),
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * m["num_heads"] != m["hidden_size"]:
        die(f"{path}: head_dim {head_dim} * num_attention_heads {m['num_heads']} != "
            f"hidden_size {m['hidden_size']} (lns_train uses hidden_size / num_heads)")
    return cfg, m


def run_lns_train(args, m, hf_dir, dump_path, workdir):
    exe = os.path.abspath(args.lns_train)
    if not os.path.isfile(exe):
        die(f"lns_train binary not found: {args.lns_train}")
    cmd = [
        exe,
        f"--vocab_size={m['vocab_size']}",
        f"--hidden_size={m['hidden_size']}",
        f"--intermediate_size={m['intermediate_size']}",
        f"--num_layers={m['num_layers']}",
        f"--num_heads={m['num_heads']}",
        f"--num_kv_heads={m['num_kv_heads']}",
        f"--rope_theta={fmt_num(m['rope_theta'])}",
        f"--norm_eps={fmt_num(m['norm_eps'])}",
        "--norm_scheme=pre",
        "--norm_type=rmsnorm",
        f"--tie_embeddings={'true' if m['tie_embeddings'] else 'false'}",
        f"--seq_len={args.seq_len}",
        f"--micro_batch_size={args.batch}",
        f"--global_batch_size={args.batch}",
        "--data=random",
        f"--seed={args.seed}",
        f"--init_from={os.path.join(hf_dir, 'model.safetensors')}",
        f"--dump_step_state={dump_path}",
    ]
    print("running:", " ".join(cmd), flush=True)
    try:
        # cwd = scratch dir so that nothing stray lands in the caller's tree.
        subprocess.run(cmd, check=True, cwd=workdir,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.CalledProcessError as e:
        print(f"lns_train failed with exit status {e.returncode}", file=sys.stderr)
        if e.stdout:
            print("---- lns_train stdout ----", file=sys.stderr)
            print(e.stdout, file=sys.stderr)
        print("---- lns_train stderr ----", file=sys.stderr)
        print(e.stderr, file=sys.stderr)
        die("lns_train did not produce a dump")
    if not os.path.isfile(dump_path):
        die(f"lns_train exited 0 but wrote no dump at {dump_path}")


def load_hf_model(hf_dir, tie_embeddings):
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    # transformers >= 4.56 spells the dtype argument `dtype`; older ones `torch_dtype`.
    ver = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    dtype_kw = "dtype" if ver >= (4, 56) else "torch_dtype"
    kwargs = {
        dtype_kw: torch.float32,
        "attn_implementation": "eager",
        "local_files_only": True,
        "output_loading_info": True,
    }
    model, info = LlamaForCausalLM.from_pretrained(hf_dir, **kwargs)
    missing = [k for k in info.get("missing_keys", [])
               if not (tie_embeddings and k == "lm_head.weight")]
    unexpected = list(info.get("unexpected_keys", []))
    mismatched = list(info.get("mismatched_keys", []))
    if missing or unexpected or mismatched:
        die("transformers did not load the export cleanly: "
            f"missing={sorted(missing)} unexpected={sorted(unexpected)} "
            f"mismatched={mismatched}")
    model.eval()
    if next(model.parameters()).dtype != torch.float32:
        die(f"model loaded as {next(model.parameters()).dtype}, expected float32")
    return model


def cross_entropy(logits, targets):
    """Mean CE over targets != -100 (same convention as lns_train). float64."""
    import torch
    import torch.nn.functional as F
    V = logits.shape[-1]
    return F.cross_entropy(torch.as_tensor(logits, dtype=torch.float64).reshape(-1, V),
                           torch.as_tensor(targets, dtype=torch.long).reshape(-1),
                           ignore_index=-100).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf_dir", required=True, help="export-hf output directory")
    ap.add_argument("--lns_train", default="./build/lns_train")
    ap.add_argument("--seq_len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="pass if max|diff| / max|logit| <= tol")
    ap.add_argument("--keep_dump", default="",
                    help="also copy the lns_train dump to this path")
    args = ap.parse_args()

    hf_dir = os.path.abspath(args.hf_dir)
    _, m = read_config(hf_dir)
    print("config:", json.dumps(m, sort_keys=True))

    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory(prefix="check_hf_export_") as tmp:
        dump_path = os.path.join(tmp, "dump.safetensors")
        run_lns_train(args, m, hf_dir, dump_path, tmp)
        dump = load_file(dump_path)
        if args.keep_dump:
            import shutil
            shutil.copyfile(dump_path, args.keep_dump)

    for key in ("inputs", "logits"):
        if key not in dump:
            die(f"dump has no {key!r} (keys: {sorted(dump)[:10]}...)")
    inputs = dump["inputs"]
    lns_logits = dump["logits"].astype(np.float32)
    B, T, V = args.batch, args.seq_len, m["vocab_size"]
    if inputs.shape != (B, T) or lns_logits.shape != (B, T, V):
        die(f"unexpected dump shapes: inputs {inputs.shape}, logits {lns_logits.shape}; "
            f"expected ({B}, {T}) and ({B}, {T}, {V})")
    if inputs.min() < 0 or inputs.max() >= V:
        die(f"dump inputs out of range [0, {V}): min {inputs.min()}, max {inputs.max()}")

    model = load_hf_model(hf_dir, m["tie_embeddings"])
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(inputs.astype(np.int64)), use_cache=False)
    hf_logits = out.logits.float().numpy()

    if not np.all(np.isfinite(lns_logits)):
        die("lns_train logits contain NaN/Inf", code=1)
    if not np.all(np.isfinite(hf_logits)):
        die("transformers logits contain NaN/Inf", code=1)

    diff = np.abs(hf_logits.astype(np.float64) - lns_logits.astype(np.float64))
    max_abs = float(diff.max())
    scale = float(np.abs(lns_logits).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    where = np.unravel_index(int(diff.argmax()), diff.shape)
    argmax_agree = float((hf_logits.argmax(-1) == lns_logits.argmax(-1)).mean())

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"logits [B={B}, T={T}, V={V}]: max |logit| (lns_train) = {scale:.6g}")
    print(f"max abs diff = {max_abs:.3e} at (b={where[0]}, t={where[1]}, v={where[2]})")
    print(f"max rel diff = {max_rel:.3e} (abs diff / max |logit|), tol = {args.tol:.1e}")
    print(f"argmax agreement = {argmax_agree * 100:.2f}%")

    # Losses: the dump's loss is over its own targets (from the data stream); evaluate both
    # models' logits against those same targets so the numbers are comparable.
    if "targets" in dump:
        targets = dump["targets"]
        ce_lns = cross_entropy(lns_logits, targets)
        ce_hf = cross_entropy(hf_logits, targets)
        dump_loss = float(np.asarray(dump["loss"]).reshape(-1)[0]) if "loss" in dump else float("nan")
        print(f"loss: lns_train dump = {dump_loss:.6f}, CE(lns logits, dump targets) = {ce_lns:.6f}, "
              f"CE(transformers logits, dump targets) = {ce_hf:.6f}")
    # Next-token CE on the inputs themselves (not comparable to the dump loss).
    ce_next_lns = cross_entropy(lns_logits[:, :-1], inputs[:, 1:])
    ce_next_hf = cross_entropy(hf_logits[:, :-1], inputs[:, 1:])
    print(f"next-token CE on inputs: lns_train = {ce_next_lns:.6f}, transformers = {ce_next_hf:.6f}")

    if max_rel <= args.tol:
        print(f"PASS: transformers LlamaForCausalLM matches lns_train "
              f"(max rel diff {max_rel:.3e} <= {args.tol:.1e})")
        return 0
    print(f"FAIL: transformers logits differ from lns_train: max rel diff {max_rel:.3e} > "
          f"tol {args.tol:.1e} (max abs diff {max_abs:.3e})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
