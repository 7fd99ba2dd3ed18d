#!/usr/bin/env python3
"""A LLaMA without norms: the model `lns_convert export-folded` writes (docs/ln_free.md).

An LN-free model (`lns_train --ln_free`) whose every norm divides by one constant is
folded by `lns_convert fold-norms`: each pre-norm's gain, depth scale and constant are
multiplied into the linears it feeds, the final norm's into lm_head. What is left is
this model, float32, no norm anywhere (a Hugging Face LLaMA always normalises, so it
cannot load it):

    x = embed[ids]                                  # [B, T, C]
    per layer:  x = x + b_attn * o(attn(rope(q x), rope(k x), v x))   (causal, GQA)
                x = x + b_mlp  * down(silu(gate x) * up x)
    logits = x @ lm_head^T                          # [B, T, V]

b_* are 1, or the learned `model.layers.{i}.raw_scaling_factor_{attn,mlp}` of
scale_res_pre_norm layers (the reference repository's names and form). RoPE is the half-split (rotate_half) layout with
config.json's rope_theta. Files: DIR/config.json (model_type "lns_llama_nonorm") and
DIR/model.safetensors (our tensor names, [out, in] like torch.nn.Linear), read here
with numpy (no safetensors package needed).

    python3 tools/reference/llama_nonorm.py --model DIR --data FILE.tok --seq_len T \
        --eval_tokens N        # prints {"loss": ..., "tokens": ...}

The loss is lns_eval's: packed sequences of the token file from its start, the mean
cross-entropy over the first N target positions. Needs torch and numpy.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import prepare_data  # noqa: E402  (read_token_file)



def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "lns_llama_nonorm":
        raise ValueError(f"{model_dir}/config.json: model_type is {cfg.get('model_type')!r}, "
                         "expected 'lns_llama_nonorm' (lns_convert export-folded)")
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    W = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {e['dtype']}, expected F32")
        b, end = e["data_offsets"]
        a = np.frombuffer(data, np.float32, (end - b) // 4, 8 + n + b).reshape(e["shape"])
        W[name] = torch.from_numpy(a.copy())
    return cfg, W


def rope(x, theta):
    """x: [B, T, H, D]; half-split layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    T, D = x.shape[1], x.shape[3]
    inv = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]       # [T, D/2]
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def forward(cfg, W, ids):
    """ids: [B, T] int64 -> logits [B, T, V] float32."""
    B, T = ids.shape
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg["hidden_size"] // Hq
    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        q = rope((x @ W[p + "self_attn.q_proj.weight"].T).view(B, T, Hq, D), cfg["rope_theta"])
        k = rope((x @ W[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D), cfg["rope_theta"])
        v = (x @ W[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D)
        k, v = (t.repeat_interleave(Hq // Hkv, dim=2) for t in (k, v))         # q head h: kv head h // group
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        ctx = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, Hq * D)
        b = W.get(p + "raw_scaling_factor_attn", torch.ones(()))
        x = x + (ctx @ W[p + "self_attn.o_proj.weight"].T) * b
        h = F.silu(x @ W[p + "mlp.gate_proj.weight"].T) * (x @ W[p + "mlp.up_proj.weight"].T)
        b = W.get(p + "raw_scaling_factor_mlp", torch.ones(()))
        x = x + (h @ W[p + "mlp.down_proj.weight"].T) * b
    return x @ W["lm_head.weight"].T


def eval_loss(cfg, W, tokens, T, eval_tokens, batch=8):
    """lns_eval's packed evaluation: sequence s is tokens[s*T : s*T + T + 1]."""
    n_seq = min(-(-eval_tokens // T), (len(tokens) - 1) // T)
    eval_tokens = min(eval_tokens, n_seq * T)
    total, count = 0.0, 0
    for s0 in range(0, n_seq, batch):
        seqs = [tokens[s * T:s * T + T + 1] for s in range(s0, min(s0 + batch, n_seq))]
        ids = torch.tensor([q[:T] for q in seqs], dtype=torch.int64)
        tgt = torch.tensor([q[1:] for q in seqs], dtype=torch.int64)
        pos = torch.arange(s0 * T, s0 * T + tgt.numel()).view(tgt.shape)
        tgt[pos >= eval_tokens] = -100
        with torch.no_grad():
            logits = forward(cfg, W, ids)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), tgt.reshape(-1),
                                 ignore_index=-100, reduction="sum").item()
        count += int((tgt != -100).sum())
    return total / count, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="directory written by lns_convert export-folded")
    ap.add_argument("--data", required=True, help="token file (tools/prepare_data.py)")
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--eval_tokens", type=int, default=65536)
    a = ap.parse_args()
    cfg, W = load(a.model)
    tokens, _, _ = prepare_data.read_token_file(a.data)
    loss, n = eval_loss(cfg, W, tokens, a.seq_len, a.eval_tokens)
    print(json.dumps({"loss": loss, "tokens": n}))


if __name__ == "__main__":
    main()
