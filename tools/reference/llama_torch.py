#!/usr/bin/env python3
"""Efficient torch.nn.Module version of the model in llama_reference.py.

Same semantics as the float64 functional reference (see its module docstring
and block_plan()), but built from nn.Linear / F.rms_norm / F.layer_norm /
F.scaled_dot_product_attention so that it runs at ordinary PyTorch speed in
float32 on CPU or bfloat16 on GPU. It is meant as a speed baseline for the C++
stack (tools/bench/bench_step_torch.py) and is checked against the reference:

    python3 tools/reference/llama_torch.py --check

Parameter names (named_parameters()) are exactly the Hugging Face names the
reference, the golden files and the C++ code use, in the same order as
llama_reference.weight_shapes(cfg):
    model.embed_tokens.weight
    model.layers.{i}.raw_scaling_factor_{attn,mlp} (scale_res_pre_norm; 0-dim)
    model.layers.{i}.<norm>.weight / .bias        (only the norms block i uses)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.norm.weight / .bias
    lm_head.weight                                 (absent with tie_embeddings)
"""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tools/reference/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402

IGNORE_INDEX = ref.IGNORE_INDEX

_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "rope_theta", "norm_eps", "norm_type", "norm_scheme",
                  "post_layers", "tie_embeddings")


def _sdpa_supports_gqa():
    """True when F.scaled_dot_product_attention accepts enable_gqa (torch >= 2.5)."""
    try:
        q = torch.zeros(1, 2, 1, 2)
        kv = torch.zeros(1, 1, 1, 2)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


SDPA_GQA = _sdpa_supports_gqa()
HAS_RMS_NORM = hasattr(F, "rms_norm")


def _check_cfg(cfg):
    missing = [k for k in _REQUIRED_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config is missing keys: {missing}")
    # The reference's checks (norm names, divisibility, even head_dim) without
    # its training-only keys (seq_len, micro_batch_size).
    full = dict(cfg)
    full.setdefault("seq_len", 1)
    full.setdefault("micro_batch_size", 1)
    ref.check_config(full)


# ----------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------

class Norm(nn.Module):
    """RMSNorm (gain only) or LayerNorm (gain + bias, biased variance) over the
    last dim; forward(x, scale) = scale * N(x), the scale folded into the gain."""

    def __init__(self, C, norm_type, eps, dtype, device):
        super().__init__()
        self.layernorm = norm_type == "layernorm"
        self.eps = float(eps)
        self.shape = (C,)
        self.weight = nn.Parameter(torch.ones(C, dtype=dtype, device=device))
        if self.layernorm:
            self.bias = nn.Parameter(torch.zeros(C, dtype=dtype, device=device))

    def forward(self, x, scale=1.0):
        w = self.weight if scale == 1.0 else self.weight * scale
        if self.layernorm:
            b = self.bias if scale == 1.0 else self.bias * scale
            return F.layer_norm(x, self.shape, w, b, self.eps)
        if HAS_RMS_NORM:
            return F.rms_norm(x, self.shape, w, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w


def rotate_half_apply(x, cos, sin):
    """x: [B, T, H, D]; cos/sin: [T, 1, D] (halves repeated, HF rotate_half layout)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        C = cfg["hidden_size"]
        self.Hq, self.Hkv = cfg["num_heads"], cfg["num_kv_heads"]
        self.D = C // self.Hq
        kw = dict(bias=False, dtype=dtype, device=device)
        self.q_proj = nn.Linear(C, self.Hq * self.D, **kw)
        self.k_proj = nn.Linear(C, self.Hkv * self.D, **kw)
        self.v_proj = nn.Linear(C, self.Hkv * self.D, **kw)
        self.o_proj = nn.Linear(self.Hq * self.D, C, **kw)
        self.use_sdpa_gqa = SDPA_GQA  # False: expand kv heads explicitly

    def forward(self, u, cos, sin):
        B, T, _ = u.shape
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        q = rotate_half_apply(self.q_proj(u).view(B, T, Hq, D), cos, sin).transpose(1, 2)
        k = rotate_half_apply(self.k_proj(u).view(B, T, Hkv, D), cos, sin).transpose(1, 2)
        v = self.v_proj(u).view(B, T, Hkv, D).transpose(1, 2)        # [B, H, T, D]
        if Hkv == Hq:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.use_sdpa_gqa:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # q head h uses kv head h // group
            g = Hq // Hkv
            k = k[:, :, None].expand(B, Hkv, g, T, D).reshape(B, Hq, T, D)
            v = v[:, :, None].expand(B, Hkv, g, T, D).reshape(B, Hq, T, D)
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(B, T, Hq * D))


class MLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        C, I = cfg["hidden_size"], cfg["intermediate_size"]
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_proj = nn.Linear(C, I, **kw)
        self.up_proj = nn.Linear(C, I, **kw)
        self.down_proj = nn.Linear(I, C, **kw)

    def forward(self, u):
        return self.down_proj(F.silu(self.gate_proj(u)) * self.up_proj(u))


class Block(nn.Module):
    """One transformer block; its norms are attributes named as in HF
    (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
    post_feedforward_layernorm), only those llama_reference.block_plan uses."""

    def __init__(self, cfg, i, dtype, device):
        super().__init__()
        self.plan = ref.block_plan(cfg, i)
        # Registration order = llama_reference.weight_shapes order: norms first.
        for name in ref.block_norm_names(cfg, i):
            self.add_module(name, Norm(cfg["hidden_size"], cfg["norm_type"], cfg["norm_eps"],
                                       dtype, device))
        self.self_attn = Attention(cfg, dtype, device)
        self.mlp = MLP(cfg, dtype, device)
        # scale_res_pre_norm: one learned scalar on each sublayer's output, a 0-dim
        # parameter of the block, named as the reference repository names it.
        for sub in ("attn", "mlp"):
            if self.plan[sub]["res"]:
                setattr(self, self.plan[sub]["res"], nn.Parameter(torch.ones((), dtype=dtype, device=device)))

    def _sublayer(self, plan, fn, x, *args):
        # u = s N_pre(x); f = F(u); f2 = N_out(f); r = alpha x + b f2; y = N_add(r)
        u = getattr(self, plan["pre"])(x, plan["s"]) if plan["pre"] else x
        f = fn(u, *args)
        if plan["out"]:
            f = getattr(self, plan["out"])(f)
        if plan["res"]:
            r = x + f * getattr(self, plan["res"])
        else:
            r = f + x if plan["alpha"] == 1.0 else torch.add(f, x, alpha=plan["alpha"])
        if plan["add"]:
            r = getattr(self, plan["add"])(r)
        return r

    def forward(self, x, cos, sin):
        x = self._sublayer(self.plan["attn"], self.self_attn, x, cos, sin)
        return self._sublayer(self.plan["mlp"], self.mlp, x)


class Backbone(nn.Module):
    """The HF "model." prefix: embed_tokens, layers, norm."""

    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"],
                                         dtype=dtype, device=device)
        self.layers = nn.ModuleList(Block(cfg, i, dtype, device) for i in range(cfg["num_layers"]))
        self.norm = Norm(cfg["hidden_size"], cfg["norm_type"], cfg["norm_eps"], dtype, device)


class LlamaModel(nn.Module):
    """LlamaModel(cfg, dtype, device): forward(inputs[B, T] int) -> logits [B, T, V].

    cfg: the llama_reference config keys (seq_len / micro_batch_size optional;
    seq_len, when given, sizes the precomputed RoPE table, which otherwise grows
    on demand). Optional init_std / embed_init_std (default 0.02) drive
    reset_parameters(), the C++ init (src/model/block_plan.cpp init_std_for):
    embedding N(0, embed_init_std); other matrices N(0, init_std), except
    o_proj/down_proj N(0, init_std / sqrt(2L)) in scaled_init and in scale_post_pre's
    Pre-LN layers (index >= post_layers), and the block matrices of deepnorm and
    deeppost_corrected Xavier-normal with gain 1 (q, k) or (8L)^-1/4 (v, o, gate, up,
    down), of deeppost with (8L)^+1/4 (the reference repository's exponent);
    norm gains 1, biases 0, branch scales 0.001.
    """

    def __init__(self, cfg, dtype=torch.float32, device="cpu", seed=None):
        super().__init__()
        _check_cfg(cfg)
        self.cfg = dict(cfg)
        self.model = Backbone(cfg, dtype, device)
        if not cfg["tie_embeddings"]:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False,
                                     dtype=dtype, device=device)
        else:
            self.lm_head = None
        self._rope_len = 0
        self.register_buffer("rope_cos", torch.empty(0, 1, ref.head_dim(cfg), dtype=dtype,
                                                     device=device), persistent=False)
        self.register_buffer("rope_sin", torch.empty_like(self.rope_cos), persistent=False)
        self._build_rope(int(cfg.get("seq_len", 0) or 0))
        self.reset_parameters(seed)

    # -- RoPE ----------------------------------------------------------------
    def _build_rope(self, T):
        """cos/sin tables [T, 1, D], computed in float64, stored in the model dtype."""
        if T <= self._rope_len:
            return
        cfg = self.cfg
        D = ref.head_dim(cfg)
        j = torch.arange(D // 2, dtype=torch.float64)
        inv_freq = float(cfg["rope_theta"]) ** (-2.0 * j / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)[:, None, :]          # [T, 1, D]
        dev, dt = self.rope_cos.device, self.rope_cos.dtype
        self.rope_cos = torch.cos(ang).to(device=dev, dtype=dt)
        self.rope_sin = torch.sin(ang).to(device=dev, dtype=dt)
        self._rope_len = T

    # -- init ----------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, seed=None):
        cfg = self.cfg
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
        init_std = float(cfg.get("init_std", 0.02))
        embed_std = float(cfg.get("embed_init_std", 0.02))
        L = cfg["num_layers"]
        scheme = cfg["norm_scheme"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            if name.endswith("norm.bias"):
                p.zero_()
                continue
            if ".raw_scaling_factor_" in name:
                p.fill_(0.001)
                continue
            fan_out, fan_in = p.shape
            kind = name.rsplit(".", 2)[-2]                # q_proj, ..., embed_tokens, lm_head
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
            xavier = {"deepnorm": -0.25, "deeppost_corrected": -0.25, "deeppost": 0.25}.get(scheme)
            if kind == "embed_tokens":
                std = embed_std
            elif xavier is not None and kind.endswith("_proj"):
                gain = 1.0 if kind in ("q_proj", "k_proj") else (8.0 * L) ** xavier
                std = gain * math.sqrt(2.0 / (fan_in + fan_out))
            elif kind in ("o_proj", "down_proj") and (
                    scheme == "scaled_init" or (scheme == "scale_post_pre" and layer >= cfg["post_layers"])):
                std = init_std / math.sqrt(2.0 * L)
            else:
                std = init_std
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_((z * std).to(p.dtype))

    # -- weights by HF name --------------------------------------------------
    def hf_names(self):
        return [n for n, _ in self.named_parameters()]

    @torch.no_grad()
    def load_hf_state(self, tensors, ignore_non_weights=True):
        """Copy HF-named tensors into the parameters (cast to their dtype/device).

        Strict: raises ValueError on missing or unexpected weight names and on
        shape mismatches. With ignore_non_weights (default), keys that do not
        start with "model." or "lm_head." (e.g. golden-file "logits", "grad.*")
        are skipped, as llama_reference.load_weights does.
        """
        params = dict(self.named_parameters())
        given = dict(tensors)
        if ignore_non_weights:
            given = {k: v for k, v in given.items() if k.startswith(("model.", "lm_head."))}
        missing = [k for k in params if k not in given]
        unexpected = [k for k in given if k not in params]
        bad_shape = [f"{k}: {tuple(given[k].shape)} != {tuple(p.shape)}"
                     for k, p in params.items() if k in given and tuple(given[k].shape) != tuple(p.shape)]
        if missing or unexpected or bad_shape:
            raise ValueError(f"load_hf_state: missing={missing} unexpected={unexpected} "
                             f"shape_mismatch={bad_shape}")
        for k, p in params.items():
            p.copy_(given[k].detach().to(device=p.device, dtype=p.dtype))

    def hf_state(self):
        """{HF name: detached parameter tensor} (no copy)."""
        return {n: p.detach() for n, p in self.named_parameters()}

    # -- compute -------------------------------------------------------------
    def forward(self, inputs):
        T = inputs.shape[1]
        if T > self._rope_len:
            self._build_rope(T)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        h = self.model.embed_tokens(inputs.long())
        for block in self.model.layers:
            h = block(h, cos, sin)
        h = self.model.norm(h)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, head)

    @staticmethod
    def loss(logits, targets):
        """Mean cross-entropy over positions whose target != -100. Half-precision
        logits are upcast to float32 first."""
        V = logits.shape[-1]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX, reduction="mean")


def loss(logits, targets):
    return LlamaModel.loss(logits, targets)


def num_params(model):
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------
# Self-check against llama_reference
# ----------------------------------------------------------------------------

def tiny_config(norm_type, norm_scheme, num_kv_heads=2):
    """The golden-file config (tools/reference/make_golden.py case_config)."""
    layernorm = norm_type == "layernorm"
    return {
        "vocab_size": 53, "hidden_size": 36, "intermediate_size": 45, "num_layers": 3,
        "num_heads": 6, "num_kv_heads": num_kv_heads,
        "rope_theta": 500.0 if layernorm else 10000.0, "norm_eps": 1e-5,
        "norm_type": norm_type, "norm_scheme": norm_scheme, "post_layers": 1,
        "tie_embeddings": layernorm, "seq_len": 7, "micro_batch_size": 2,
    }


def _rel_err(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-300)


def _check_case(cfg, seed, tol, force_expand=False):
    gen = torch.Generator().manual_seed(seed)
    w32 = ref.init_weights(cfg, generator=gen)
    B, T, V = cfg["micro_batch_size"], cfg["seq_len"], cfg["vocab_size"]
    inputs = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
    targets.view(-1)[torch.randperm(B * T, generator=gen)[:3]] = IGNORE_INDEX

    W = ref.load_weights(cfg, w32)
    ref_logits, ref_loss, ref_grads = ref.forward_backward(cfg, W, inputs, targets)

    m = LlamaModel(cfg, dtype=torch.float64)
    if force_expand:
        for blk in m.model.layers:
            blk.self_attn.use_sdpa_gqa = False
    names = m.hf_names()
    want = list(ref.weight_shapes(cfg))
    assert names == want, f"parameter names/order differ:\n{names}\nvs\n{want}"
    m.load_hf_state(w32)
    m.zero_grad(set_to_none=True)
    logits = m(inputs)
    lss = m.loss(logits, targets)
    lss.backward()

    errs = {"logits": _rel_err(logits.detach(), ref_logits),
            "loss": _rel_err(lss.detach(), ref_loss)}
    for n, p in m.named_parameters():
        assert p.grad is not None, f"no gradient for {n}"
        errs["grad." + n] = _rel_err(p.grad, ref_grads[n])
    worst_key = max(errs, key=errs.get)
    ok = errs[worst_key] <= tol
    return ok, errs, worst_key, lss.item()


def check_against_reference(tol=1e-10, verbose=True):
    """Every scheme x norm type on the tiny GQA golden config, float64: logits,
    loss and every gradient must equal llama_reference's within `tol` (max abs
    difference relative to the reference tensor's max abs). Also one MHA case
    and one GQA case with explicit kv-head expansion. Raises AssertionError."""
    cases = []
    idx = 0
    for schemes in (ref.NORM_SCHEMES, ref.EXTRA_SCHEMES):
        for norm_type in ref.NORM_TYPES:
            for norm_scheme in schemes:
                cfg = tiny_config(norm_type, norm_scheme)
                if norm_scheme == "hybrid":
                    cfg["layer_schemes"] = "scale_res_pre_norm,deeppost,sandwich"
                cases.append((f"{norm_type:9s} {norm_scheme:11s}", cfg, 1000 + idx, False))
                idx += 1
    cases.append(("rmsnorm   lns  MHA   ", tiny_config("rmsnorm", "lns", num_kv_heads=6), 2000, False))
    cases.append(("layernorm mix  expand", tiny_config("layernorm", "mix"), 2001, True))
    failed = []
    for label, cfg, seed, expand in cases:
        ok, errs, worst_key, lval = _check_case(cfg, seed, tol, force_expand=expand)
        if verbose:
            print(f"{label} loss={lval:.9f} logits_rel={errs['logits']:.1e} "
                  f"max_rel={errs[worst_key]:.1e} ({worst_key}) {'OK' if ok else 'FAIL'}", flush=True)
        if not ok:
            failed.append(label.strip())
    if failed:
        raise AssertionError(f"llama_torch differs from llama_reference (tol {tol}): {failed}")
    if verbose:
        print(f"all {len(cases)} cases OK (tol {tol:g}; sdpa enable_gqa={SDPA_GQA}, "
              f"F.rms_norm={HAS_RMS_NORM}, torch {torch.__version__})")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with llama_reference (float64)")
    ap.add_argument("--tol", type=float, default=1e-10)
    args = ap.parse_args()
    if not args.check:
        ap.print_help()
        return
    try:
        check_against_reference(args.tol)
    except AssertionError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
