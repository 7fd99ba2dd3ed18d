"""Independent float64 PyTorch reference for the LLaMA-family training stack.

Self-contained (no `transformers`): a functional model that takes a dict of
Hugging-Face-named weight tensors, so the same names are used by the C++ code,
the golden files and this reference.

Config keys (a plain dict):
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads,
    num_kv_heads, rope_theta, norm_eps,
    norm_type   : "rmsnorm" | "layernorm"
    norm_scheme : "pre" | "lns" | "post" | "mix" | "sandwich" | "deepnorm" | "scaled_init"
                  | "deeppost" | "scale_post_pre" | "hybrid" | "scale_res_pre_norm"
                  | "routed" | "mono" | "mono_reverse"
                  | "deeppost_corrected" | "mono_reverse_corrected"
    post_layers : int (mix / scale_post_pre: blocks with index < post_layers are post-norm)
    layer_schemes : str (hybrid only, optional key otherwise): the per-layer pattern
                  FORM[:COUNT],...[,*] of include/lns/model/layer_schemes.h
    tie_embeddings : bool (logits use model.embed_tokens.weight, no lm_head.weight)
    seq_len, micro_batch_size

Sublayer (attention, then MLP) of block i, l = i + 1:
    u  = s * N_pre(x)      if the scheme has a pre-norm, else x
    f  = F(u)
    f2 = N_out(f)          sandwich only, else f
    r  = alpha * x + b * f2   b: scale_res_pre_norm's learned scalar
                              (model.layers.{i}.raw_scaling_factor_attn / _mlp, 0-dim), else 1
    y  = N_add(r)          post / deepnorm / mix post-layers, else r

The reference repository's variants are written from its model file
(lmsdss/LayerNorm-Scaling, peft_pretraining/modeling_llama.py at commit 33c3899;
docs/model.md has the line numbers): scale_res_pre_norm scales the sublayer's output,
not the residual; mono_reverse's post layers normalise the MLP's input with
post_attention_layernorm a second time (N_pre = N_add of the attention sublayer);
mono_reverse_corrected is the same with plain Post-LN layers.

Routed blocks (form "routed"; mono / mono_reverse use it every 4th layer,
0-based layers 3, 7, ...): the block's input x runs through the whole block twice
with the same attention and MLP weights, once as a Pre-LN block (input_layernorm,
post_attention_layernorm) and once as a Post-LN block (post_attention_layernorm,
post_feedforward_layernorm; the post_attention_layernorm gain is shared), and
    logits[b] = mean_t(x[b, t] @ router.weight.T)            [B, 2]
    soft      = softmax((logits + g) / tau), tau = 1         g: Gumbel noise [B, 2]
    gate      = onehot(argmax soft) - soft.detach() + soft   (straight-through)
    y[b]      = gate[b, 0] * pre_path(x)[b] + gate[b, 1] * post_path(x)[b]
g is an input (forward(..., noise={layer: [B, 2]})); without it (evaluation)
g = 0, i.e. the gate is the router's argmax.
"""

import math

import torch
import torch.nn.functional as F

DTYPE = torch.float64
IGNORE_INDEX = -100

NORM_TYPES = ("rmsnorm", "layernorm")
NORM_SCHEMES = ("pre", "lns", "post", "mix", "sandwich", "deepnorm", "scaled_init")
# The reference repository's other variants (docs/model.md), golden files of their own.
EXTRA_SCHEMES = ("deeppost", "scale_post_pre", "hybrid", "scale_res_pre_norm")
# The Gumbel-routed blocks (added after EXTRA_SCHEMES so no earlier golden seed moves).
ROUTED_SCHEMES = ("mono", "mono_reverse")
# Corrected forms of the repository's slips (after ROUTED_SCHEMES, for the same reason):
# deeppost_corrected differs from deeppost in its init only, so it has no golden file.
CORRECTED_SCHEMES = ("mono_reverse_corrected",)
OTHER_SCHEMES = ("deeppost_corrected", "routed")
BLOCK_FORMS = ("pre", "lns", "post", "deeppost", "sandwich", "scale_res_pre_norm", "routed")
ROUTE_EVERY = 4  # mono / mono_reverse: 0-based layers 3, 7, 11, ... are routed
GUMBEL_TAU = 1.0

CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
    "num_kv_heads", "rope_theta", "norm_eps", "norm_type", "norm_scheme",
    "post_layers", "tie_embeddings", "seq_len", "micro_batch_size",
)


def check_config(cfg):
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config is missing keys: {missing}")
    if cfg["norm_type"] not in NORM_TYPES:
        raise ValueError(f"bad norm_type {cfg['norm_type']!r}")
    if cfg["norm_scheme"] not in NORM_SCHEMES + EXTRA_SCHEMES + ROUTED_SCHEMES + CORRECTED_SCHEMES + OTHER_SCHEMES:
        raise ValueError(f"bad norm_scheme {cfg['norm_scheme']!r}")
    if cfg["hidden_size"] % cfg["num_heads"]:
        raise ValueError("hidden_size must be divisible by num_heads")
    if cfg["num_heads"] % cfg["num_kv_heads"]:
        raise ValueError("num_heads must be divisible by num_kv_heads")
    if (cfg["hidden_size"] // cfg["num_heads"]) % 2:
        raise ValueError("head_dim must be even for RoPE")


def head_dim(cfg):
    return cfg["hidden_size"] // cfg["num_heads"]


# ----------------------------------------------------------------------------
# Which norms a block uses, and how (the norm-scheme table)
# ----------------------------------------------------------------------------

def layer_forms(pattern, L):
    """The block form of each of L layers from a --layer_schemes pattern, written
    from its specification (include/lns/model/layer_schemes.h), not from the C++ code."""
    items = pattern.split(",")
    repeat = items[-1] == "*"
    if repeat:
        items = items[:-1]
    runs = []
    for k, item in enumerate(items):
        form, _, count = item.partition(":")
        if form not in BLOCK_FORMS:
            raise ValueError(f"bad form {form!r}")
        if count:
            n = int(count)
        elif k == len(items) - 1 and not repeat:
            n = None  # the rest
        else:
            n = 1
        runs.append((form, n))
    fixed = sum(n for _, n in runs if n is not None)
    out = []
    while len(out) < L:
        for form, n in runs:
            out += [form] * (L - fixed if n is None else n)
        if not repeat:
            break
    if not repeat and len(out) != L:
        raise ValueError(f"pattern {pattern!r} covers {len(out)} of {L} layers")
    return out[:L]


def block_plan(cfg, i):
    """Norm layout of block i (0-based).

    Returns a dict with, for sublayer "attn" and "mlp", a dict of
    pre / out / add: norm module name (str) or None, plus the scalars
    s (pre-norm output scale) and alpha (residual multiplier).
    """
    scheme = cfg["norm_scheme"]
    L = cfg["num_layers"]
    l = i + 1
    if scheme in ("mix", "scale_post_pre"):
        scheme = "post" if i < cfg["post_layers"] else "pre"
    if scheme == "hybrid":
        scheme = layer_forms(cfg["layer_schemes"], L)[i]
    if scheme in ROUTED_SCHEMES + CORRECTED_SCHEMES:
        if (i + 1) % ROUTE_EVERY == 0:
            scheme = "routed"
        else:
            scheme = {"mono": "pre", "mono_reverse": "mono_reverse_post",
                      "mono_reverse_corrected": "post"}[scheme]
    if scheme == "routed":  # path 0 a Pre-LN block, path 1 a Post-LN block, same weights
        pre = block_plan(dict(cfg, norm_scheme="pre"), i)
        post = block_plan(dict(cfg, norm_scheme="post"), i)
        return {"attn": pre["attn"], "mlp": pre["mlp"], "alt": post, "router": "router.weight"}

    s, alpha = 1.0, 1.0
    res = scheme == "scale_res_pre_norm"  # r = x + b * f, b a learned scalar per sublayer
    if scheme in ("pre", "scaled_init", "lns", "scale_res_pre_norm"):
        attn = dict(pre="input_layernorm", out=None, add=None)
        mlp = dict(pre="post_attention_layernorm", out=None, add=None)
        if scheme == "lns":
            s = 1.0 / math.sqrt(l)
    elif scheme in ("post", "deepnorm", "deeppost", "deeppost_corrected"):
        attn = dict(pre=None, out=None, add="post_attention_layernorm")
        mlp = dict(pre=None, out=None, add="post_feedforward_layernorm")
        if scheme == "deepnorm":
            alpha = (2.0 * L) ** 0.25
        if scheme in ("deeppost", "deeppost_corrected"):
            alpha = 2.0 * math.sqrt(2.0)
    elif scheme == "mono_reverse_post":
        # the repository's: h = N_pa(x + Attn(x)); y = N_pf(h + MLP(N_pa(h)))
        attn = dict(pre=None, out=None, add="post_attention_layernorm")
        mlp = dict(pre="post_attention_layernorm", out=None, add="post_feedforward_layernorm")
    elif scheme == "sandwich":
        attn = dict(pre="input_layernorm", out="post_attention_layernorm", add=None)
        mlp = dict(pre="pre_feedforward_layernorm", out="post_feedforward_layernorm", add=None)
    else:
        raise ValueError(scheme)
    for sub in (attn, mlp):
        sub["s"] = s
        sub["alpha"] = alpha
    attn["res"] = "raw_scaling_factor_attn" if res else None
    mlp["res"] = "raw_scaling_factor_mlp" if res else None
    return {"attn": attn, "mlp": mlp}


def block_norm_names(cfg, i):
    """Norm modules owned by block i, in a fixed order (no duplicates)."""
    plan = block_plan(cfg, i)
    names = []
    for path in (plan, plan.get("alt")):
        for sub in ("attn", "mlp") if path else ():
            for key in ("pre", "out", "add"):
                n = path[sub][key]
                if n is not None and n not in names:
                    names.append(n)
    return names


def weight_shapes(cfg):
    """Ordered dict name -> shape of every weight tensor the config implies."""
    check_config(cfg)
    V, C, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    D = head_dim(cfg)
    Hq, Hkv = cfg["num_heads"], cfg["num_kv_heads"]
    ln = cfg["norm_type"] == "layernorm"

    shapes = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg["num_layers"]):
        p = f"model.layers.{i}."
        plan = block_plan(cfg, i)
        for sub in ("attn", "mlp"):  # the block's own parameters come first (nn.Module order)
            if plan[sub]["res"]:
                shapes[p + plan[sub]["res"]] = ()  # 0-dim, as the repository's nn.Parameter
        for n in block_norm_names(cfg, i):
            shapes[p + n + ".weight"] = (C,)
            if ln:
                shapes[p + n + ".bias"] = (C,)
        if plan.get("router"):
            shapes[p + plan["router"]] = (2, C)
        shapes[p + "self_attn.q_proj.weight"] = (Hq * D, C)
        shapes[p + "self_attn.k_proj.weight"] = (Hkv * D, C)
        shapes[p + "self_attn.v_proj.weight"] = (Hkv * D, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, Hq * D)
        shapes[p + "mlp.gate_proj.weight"] = (I, C)
        shapes[p + "mlp.up_proj.weight"] = (I, C)
        shapes[p + "mlp.down_proj.weight"] = (C, I)
    shapes["model.norm.weight"] = (C,)
    if ln:
        shapes["model.norm.bias"] = (C,)
    if not cfg["tie_embeddings"]:
        shapes["lm_head.weight"] = (V, C)
    return shapes


# ----------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------

def load_weights(cfg, tensors, requires_grad=True):
    """Take a dict of HF-named tensors (any float dtype, e.g. loaded with
    safetensors.torch.load_file) and return float64 leaf tensors.

    Raises on missing / unexpected names or shape mismatches. Keys that are not
    weights (e.g. golden-file entries like "logits", "grad.*") are ignored
    when they are not plain model names: only names starting with "model." or
    "lm_head." are considered weights.
    """
    shapes = weight_shapes(cfg)
    given = {k: v for k, v in tensors.items() if k.startswith(("model.", "lm_head."))}
    missing = [k for k in shapes if k not in given]
    unexpected = [k for k in given if k not in shapes]
    if missing or unexpected:
        raise ValueError(f"weight mismatch: missing={missing} unexpected={unexpected}")
    out = {}
    for name, shape in shapes.items():
        t = given[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)} != expected {shape}")
        out[name] = t.detach().to(DTYPE).clone().requires_grad_(requires_grad)
    return out


def init_weights(cfg, generator=None):
    """Random float32 weights (the golden-file init):
    linear: N(0, 1/fan_in); embedding: N(0, 1); lm_head: N(0, 1/C);
    norm gains and branch scales: 1 + 0.2 N(0,1); layernorm biases: 0.1 N(0,1).
    """
    C = cfg["hidden_size"]
    f32 = torch.float32
    out = {}
    for name, shape in weight_shapes(cfg).items():
        z = torch.randn(shape, generator=generator, dtype=f32)
        if name == "model.embed_tokens.weight":
            w = z
        elif name == "lm_head.weight":
            w = z * (1.0 / math.sqrt(C))
        elif name.endswith("norm.weight") or ".raw_scaling_factor_" in name:
            w = 1.0 + 0.2 * z
        elif name.endswith("norm.bias"):
            w = 0.1 * z
        else:  # linear [out, in]
            w = z * (1.0 / math.sqrt(shape[1]))
        out[name] = w.contiguous()
    return out


# ----------------------------------------------------------------------------
# Model pieces
# ----------------------------------------------------------------------------

def norm(cfg, W, name, x, scale=1.0):
    """y = scale * N(x) over the last dim; name is the module prefix."""
    eps = cfg["norm_eps"]
    g = W[name + ".weight"]
    if cfg["norm_type"] == "rmsnorm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    else:
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)  # biased variance
        y = (x - mu) * torch.rsqrt(var + eps) * g + W[name + ".bias"]
    return y * scale if scale != 1.0 else y


def rope_cos_sin(cfg, T):
    """cos, sin of shape [T, D] (each half repeated, HF rotate_half layout)."""
    D = head_dim(cfg)
    j = torch.arange(D // 2, dtype=DTYPE)
    inv_freq = cfg["rope_theta"] ** (-2.0 * j / D)
    pos = torch.arange(T, dtype=DTYPE)
    ang = pos[:, None] * inv_freq[None, :]          # [T, D/2]
    ang = torch.cat([ang, ang], dim=-1)             # [T, D]
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    """x: [B, H, T, D]. out[j] = x[j] cos - x[j+D/2] sin,
    out[j+D/2] = x[j+D/2] cos + x[j] sin."""
    D = x.shape[-1]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def attention(cfg, W, p, u):
    """u: [B, T, C] -> [B, T, C]."""
    B, T, _ = u.shape
    Hq, Hkv, D = cfg["num_heads"], cfg["num_kv_heads"], head_dim(cfg)
    q = u @ W[p + "self_attn.q_proj.weight"].T     # [B, T, Hq*D]
    k = u @ W[p + "self_attn.k_proj.weight"].T     # [B, T, Hkv*D]
    v = u @ W[p + "self_attn.v_proj.weight"].T
    q = q.view(B, T, Hq, D).transpose(1, 2)        # [B, Hq, T, D]
    k = k.view(B, T, Hkv, D).transpose(1, 2)
    v = v.view(B, T, Hkv, D).transpose(1, 2)

    cos, sin = rope_cos_sin(cfg, T)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)

    group = Hq // Hkv                              # q head h -> kv head h // group
    k = k.repeat_interleave(group, dim=1)          # [B, Hq, T, D]
    v = v.repeat_interleave(group, dim=1)

    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)   # [B, Hq, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    ctx = probs @ v                                # [B, Hq, T, D]
    ctx = ctx.transpose(1, 2).reshape(B, T, Hq * D)
    return ctx @ W[p + "self_attn.o_proj.weight"].T


def mlp(cfg, W, p, u):
    gate = u @ W[p + "mlp.gate_proj.weight"].T
    up = u @ W[p + "mlp.up_proj.weight"].T
    return (F.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T


def sublayer(cfg, W, p, plan, fn, x):
    u = norm(cfg, W, p + plan["pre"], x, plan["s"]) if plan["pre"] else x
    f = fn(cfg, W, p, u)
    if plan["out"]:
        f = norm(cfg, W, p + plan["out"], f)
    if plan.get("res"):
        r = x + f * W[p + plan["res"]]
    else:
        r = plan["alpha"] * x + f if plan["alpha"] != 1.0 else x + f
    if plan["add"]:
        r = norm(cfg, W, p + plan["add"], r)
    return r


def route_gate(cfg, W, p, plan, x, g, trace=None, straight_through=True):
    """The routed block's gate [B, 2] (module docstring); g: Gumbel noise [B, 2] or None.
    trace: a list that receives the router logits (before noise), or None.
    straight_through=False: the hard one-hot as a constant, the true derivative of the
    piecewise-constant gate (0), which central differences can check."""
    logits = (x @ W[p + plan["router"]].T).mean(dim=1)   # [B, 2]
    if trace is not None:
        trace.append(logits.detach().clone())
    if g is not None:
        logits = logits + g.to(DTYPE)
    soft = torch.softmax(logits / GUMBEL_TAU, dim=-1)
    hard = F.one_hot(soft.argmax(dim=-1), 2).to(DTYPE)
    return hard - soft.detach() + soft if straight_through else hard


def forward(cfg, W, inputs, noise=None, trace=None, straight_through=True):
    """inputs: integer [B, T] token ids -> float64 logits [B, T, V].
    noise: {layer index: Gumbel noise [B, 2]} for the routed layers (training);
    None or a missing layer: no noise (evaluation)."""
    inputs = inputs.long()
    h = W["model.embed_tokens.weight"][inputs]     # [B, T, C]
    for i in range(cfg["num_layers"]):
        p = f"model.layers.{i}."
        plan = block_plan(cfg, i)
        if plan.get("router"):
            gate = route_gate(cfg, W, p, plan, h, (noise or {}).get(i), trace, straight_through)
            ys = []
            for path in (plan, plan["alt"]):
                y = sublayer(cfg, W, p, path["attn"], attention, h)
                ys.append(sublayer(cfg, W, p, path["mlp"], mlp, y))
            h = gate[:, 0, None, None] * ys[0] + gate[:, 1, None, None] * ys[1]
            continue
        h = sublayer(cfg, W, p, plan["attn"], attention, h)
        h = sublayer(cfg, W, p, plan["mlp"], mlp, h)
    h = norm(cfg, W, "model.norm", h)
    head = W["model.embed_tokens.weight"] if cfg["tie_embeddings"] else W["lm_head.weight"]
    return h @ head.T


def loss_fn(logits, targets):
    """Mean cross-entropy over positions whose target != -100."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(),
                           ignore_index=IGNORE_INDEX, reduction="mean")


def forward_backward(cfg, W, inputs, targets, noise=None, straight_through=True):
    """Returns (logits, loss, grads) with grads keyed by weight name (float64).
    W must hold float64 leaf tensors with requires_grad (see load_weights)."""
    for t in W.values():
        t.grad = None
    logits = forward(cfg, W, inputs, noise, straight_through=straight_through)
    loss = loss_fn(logits, targets)
    loss.backward()
    grads = {k: t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t.detach())
             for k, t in W.items()}  # None: a router without the straight-through gradient
    return logits.detach(), loss.detach(), grads
