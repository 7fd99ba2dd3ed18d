#!/usr/bin/env python3
"""Checkpoints saved by the LayerNorm-Scaling repository's own model, one per variant it
runs, with what that model computes on them: the fixtures of
tests/format/test_repo_checkpoints.cpp (`lns_convert import-hf --repo_norm_type` must read each
and compute the same logits, loss and gradients).

    python3 tools/reference/repo_checkpoints.py --repo_dir DIR [--out_dir DIR] [--check]

DIR is a checkout of lmsdss/LayerNorm-Scaling (commit 33c3899cd7b8fde609a57aef827051fb62482159,
the one docs/model.md cites); its peft_pretraining/modeling_llama.py is imported from
there, never copied here. Needs torch, safetensors and a transformers that still has
`replace_return_docstrings` (4.45 works). CI does not run this: the fixtures are
committed under tests/golden/repo/.

Per NORM_TYPE, tests/golden/repo/<NORM_TYPE>/ holds
  config.json, model.safetensors   what the repository's save_pretrained writes (float32;
                                   its 0-dim raw_scaling_factor_* and rotary_emb.inv_freq
                                   buffers included)
  expected.safetensors             inputs [B,T] I32, logits [B,T,V], loss [], grad.<name>
                                   for every parameter (F32), gate_noise.<layer> [B,2] for
                                   routed layers; __metadata__: norm_type, post_num
Each case also runs tools/reference/llama_reference.py (the model of the golden files)
on the same checkpoint and asserts it computes the repository's logits and gradients
(relative error < 1e-5; the repository takes its RMSNorm statistics in float32).

The model: 9 layers (pre_post / pre_sandwich switch at 7; mono / mono_reverse route layers
3 and 7), hidden 8, 2 heads, intermediate 12, vocabulary 17, rms_norm_eps 1e-6, T = 6;
B = 2, except B = 1 for mono and mono_reverse, whose gate mix runs only at batch 1 in the
repository ([b,1] against [b,t,c] broadcasts over positions: an error unless b == t or 1).
Weights: drawn here in float32 so that every block, norm and scale matters (the
repository's init, std 0.02 and branch scales of 0.001, leaves the blocks near the
identity and the logits near uniform): linears N(0, 1/fan_in), embedding N(0, 1), norm
gains 1 + 0.2 N(0,1), branch scales 0.5 + 0.2 N(0,1); its init rules are checked by
tests/unit/test_init.cpp instead. Computed in float64 (model.double()); the Gumbel noise is chosen (and
stored) so that layer 3 takes the Pre-LN path and layer 7 the Post-LN one.
"""
import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VARIANTS = ("pre", "scale_pre", "post", "deeppost", "sandwich", "post_pre", "scale_post_pre",
            "scale_res_pre_norm", "mono", "mono_reverse", "pre_post", "pre_sandwich", "post_pre_post_pre")
POST_NUM = 2  # post_pre / scale_post_pre: not the default 1, so the flag is exercised
ROUTED = ("mono", "mono_reverse")
SHAPE = dict(vocab_size=17, hidden_size=8, intermediate_size=12, num_hidden_layers=9, num_attention_heads=2,
             rms_norm_eps=1e-6, max_position_embeddings=32, initializer_range=0.02, tie_word_embeddings=False)
T = 6
GATE = {3: 0, 7: 1}  # routed layer -> the path its noise makes it take


@contextlib.contextmanager
def gumbel_noise(noise_by_call):
    """The repository draws its gate with torch.nn.functional.gumbel_softmax(logits, tau=1,
    hard=True); this swaps in the same computation with given noise (one [B, 2] per call,
    in layer order): soft = softmax((logits + g) / tau), hard one-hot of its argmax,
    straight-through hard - soft.detach() + soft, as PyTorch's."""
    orig = torch.nn.functional.gumbel_softmax
    calls = iter(noise_by_call)

    def fixed(logits, tau=1, hard=False, eps=1e-10, dim=-1):
        g = next(calls).to(logits.dtype)
        soft = torch.softmax((logits + g) / tau, dim=dim)
        if not hard:
            return soft
        index = soft.argmax(dim, keepdim=True)
        onehot = torch.zeros_like(logits).scatter_(dim, index, 1.0)
        return onehot - soft.detach() + soft

    torch.nn.functional.gumbel_softmax = fixed
    try:
        yield
    finally:
        torch.nn.functional.gumbel_softmax = orig


def router_logits(model, ids, noise):
    """The router logits [B, 2] each routed layer sees, in layer order (forward hooks),
    with `noise` for the first routed layers and none for the rest."""
    seen = []
    hooks = [layer.router.register_forward_hook(lambda m, i, o: seen.append(o.mean(dim=1).detach()))
             for layer in model.model.layers if hasattr(layer, "router")]
    zeros = [torch.zeros(ids.shape[0], 2, dtype=torch.float64)] * len(hooks)
    with torch.no_grad(), gumbel_noise(noise + zeros[len(noise):]):
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


def make(repo, norm_type, out_dir):
    os.environ["NORM_TYPE"] = norm_type
    os.environ["POST_NUM"] = str(POST_NUM)
    from transformers import LlamaConfig
    torch.manual_seed(4600 + VARIANTS.index(norm_type))
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # the repository prints per layer
        model = repo.LlamaForCausalLM(LlamaConfig(**SHAPE)).float()
    with torch.no_grad():  # weights that make every block matter (module docstring)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            elif ".raw_scaling_factor_" in name:
                p.copy_(0.5 + 0.2 * torch.randn(p.shape))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape))
            else:  # linears [out, in]
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))

    model = model.double()
    B = 1 if norm_type in ROUTED else 2
    ids = torch.randint(0, SHAPE["vocab_size"], (B, T))
    noise = []
    if norm_type in ROUTED:
        for k, layer in enumerate(sorted(GATE)):  # each with the earlier layers' gates fixed
            logits = router_logits(model, ids, noise)[k]
            g = torch.zeros(B, 2, dtype=torch.float64)
            want = GATE[layer]
            g[:, want] = 3.0 - (logits[:, want] - logits[:, 1 - want])  # the chosen path leads by 3
            noise.append(g.float().double())  # exactly what the file holds
    with gumbel_noise(noise):
        outputs = model(input_ids=ids, labels=ids)
    outputs.loss.backward()
    expected = {"inputs": ids.to(torch.int32).contiguous(),
                "logits": outputs.logits.detach().float().contiguous(),
                "loss": outputs.loss.detach().float().reshape(())}
    for layer, g in zip(sorted(GATE), noise):
        expected[f"gate_noise.{layer}"] = g.float().contiguous()
    for name, p in model.named_parameters():
        expected["grad." + name] = p.grad.float().contiguous()
    meta = {"norm_type": norm_type, "post_num": str(POST_NUM),
            "generator": "tools/reference/repo_checkpoints.py"}
    return expected, meta, outputs.loss.item()


# NORM_TYPE -> llama_reference's scheme (and pattern): the mapping lns_convert import-hf
# uses (src/checkpoint/hf_llama.cpp config_for_repo_norm_type), for the cross-check below.
REFERENCE_SCHEME = {
    "pre": ("pre", None), "scale_pre": ("scaled_init", None), "post": ("post", None),
    "deeppost": ("deeppost", None), "sandwich": ("sandwich", None), "post_pre": ("mix", None),
    "scale_post_pre": ("scale_post_pre", None), "scale_res_pre_norm": ("scale_res_pre_norm", None),
    "mono": ("mono", None), "mono_reverse": ("mono_reverse", None), "pre_post": ("hybrid", "pre:7,post"),
    "pre_sandwich": ("hybrid", "pre:7,sandwich"), "post_pre_post_pre": ("hybrid", "post:3,pre,*"),
}


def reference_error(norm_type, out_dir, expected):
    """llama_reference (the golden files' model) on the repository's checkpoint: the largest
    error of its logits and gradients relative to each tensor's largest entry."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_reference as ref
    scheme, pattern = REFERENCE_SCHEME[norm_type]
    ids = expected["inputs"]
    cfg = {"vocab_size": SHAPE["vocab_size"], "hidden_size": SHAPE["hidden_size"],
           "intermediate_size": SHAPE["intermediate_size"], "num_layers": SHAPE["num_hidden_layers"],
           "num_heads": SHAPE["num_attention_heads"], "num_kv_heads": SHAPE["num_attention_heads"],
           "rope_theta": 10000.0, "norm_eps": SHAPE["rms_norm_eps"], "norm_type": "rmsnorm",
           "norm_scheme": scheme, "post_layers": POST_NUM, "tie_embeddings": False,
           "seq_len": ids.shape[1], "micro_batch_size": ids.shape[0]} | ({"layer_schemes": pattern} if pattern else {})
    saved = load_file(os.path.join(out_dir, "model.safetensors"))
    W = ref.load_weights(cfg, {k: v for k, v in saved.items() if not k.endswith("rotary_emb.inv_freq")})
    targets = torch.full_like(ids, ref.IGNORE_INDEX)
    targets[:, :-1] = ids[:, 1:]
    noise = {int(k.split(".")[1]): v.double() for k, v in expected.items() if k.startswith("gate_noise.")}
    logits, _, grads = ref.forward_backward(cfg, W, ids, targets, noise)

    def rel(a, b):
        return (a.double() - b.double()).abs().max().item() / max(b.double().abs().max().item(), 1e-30)
    return max([rel(logits, expected["logits"])] + [rel(g, expected["grad." + n]) for n, g in grads.items()])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo_dir", required=True, help="checkout of lmsdss/LayerNorm-Scaling")
    ap.add_argument("--out_dir", default=os.path.join(REPO_ROOT, "tests", "golden", "repo"))
    ap.add_argument("--check", action="store_true", help="compare expected.safetensors instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.abspath(args.repo_dir))
    import peft_pretraining.modeling_llama as repo  # noqa: E402  (the repository's file)
    bad = 0
    for norm_type in VARIANTS:
        d = os.path.join(args.out_dir, norm_type)
        target = tempfile.mkdtemp() if args.check else d
        expected, meta, loss = make(repo, norm_type, target)
        path = os.path.join(d, "expected.safetensors")
        err = reference_error(norm_type, target, expected)
        bad += err > 1e-5
        if args.check:
            old = load_file(path)
            diff = [k for k in set(old) | set(expected)
                    if k not in old or k not in expected or not torch.equal(old[k], expected[k])]
            bad += bool(diff)
            status = "OK" if not diff else f"MISMATCH {sorted(diff)[:4]}"
            shutil.rmtree(target)
        else:
            save_file(expected, path, metadata=meta)
            status = "written"
        print(f"{norm_type:20s} loss={loss:.9f} llama_reference max rel err {err:.1e} "
              f"{os.path.relpath(d, REPO_ROOT)} {status}", flush=True)
    if bad:
        sys.exit(f"{bad} fixture(s) differ, or llama_reference differs from the repository's model")


if __name__ == "__main__":
    main()
