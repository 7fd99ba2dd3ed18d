#!/usr/bin/env python3
"""The block plan of a model as lns_train prints it (`lns_train --print_block_plan`,
src/model/block_plan_json.cpp): per global layer the form it runs (its effective
scheme), the norms it owns, and for each sublayer its pre-norm with its LNS scale, its
output norm, its residual scale and its post-add norm. The perf models (step_model.py,
memory_model.py, comm_model.py) read the schemes here and never restate them: a new
scheme that fits the block's general form (lns/model/block_plan.h) needs nothing in tools/perf.

Where a plan comes from, first found first:
1. block_plans.json beside this file: lns_train's answers for every model of configs/
   (committed, so that a config's model runs where no lns_train is, such as the GPU
   node that writes a benchmark record); tests/python/test_block_plan.py holds it equal to
   what lns_train prints;
2. lns_train itself: $LNS_TRAIN_BIN, else build/lns_train.

    python3 tools/perf/block_plan.py --write   # block_plans.json again, from lns_train

What the models cannot model is refused here, by what a plan holds rather than by a
scheme's name: routed blocks (two paths and a gate) and learned branch scales.
"""
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
COMMITTED = os.path.join(HERE, "block_plans.json")


@dataclass(frozen=True)
class Sublayer:
    pre_norm: str = None        # N_pre's slot, e.g. "input_layernorm"; None: no pre-norm
    pre_scale: float = 1.0      # s: 1/sqrt(l) under LNS
    out_norm: str = None        # N_out (sandwich)
    residual_alpha: float = 1.0  # the residual's scale before the add (DeepNorm)
    learned_branch_scale: bool = False
    add_norm: str = None        # N_add (the post-LN family)

    def norms(self):
        """(pre, out, add): which of the sublayer's three norms it has."""
        return (self.pre_norm is not None, self.out_norm is not None, self.add_norm is not None)


@dataclass(frozen=True)
class Layer:
    layer: int
    depth: int
    scheme: str       # the form it runs (mix resolves to pre or post per layer)
    norms: tuple      # the norm slots it owns, each once
    attn: Sublayer
    mlp: Sublayer
    route: tuple      # None, or path 1's (attn, mlp): a routed block

    @property
    def sublayers(self):
        return (self.attn, self.mlp)


def layers_of(answer):
    """lns_train's JSON answer as a tuple of Layer."""
    sub = lambda d: Sublayer(**d)
    return tuple(Layer(l["layer"], l["depth"], l["scheme"], tuple(l["norms"]), sub(l["attn"]), sub(l["mlp"]),
                       (sub(l["route"]["attn"]), sub(l["route"]["mlp"])) if l["route"] else None)
                 for l in answer["layers"])


def request(scheme, num_layers, post_layers, layer_schemes):
    """The model flags a plan depends on, as lns_train takes them."""
    return [f"--norm_scheme={scheme}", f"--num_layers={num_layers}", f"--post_layers={post_layers}",
            f"--layer_schemes={layer_schemes}"]


def matches(answer, scheme, num_layers, post_layers, layer_schemes):
    return (answer["norm_scheme"], answer["num_layers"], answer["post_layers"], answer["layer_schemes"],
            answer["folded_norms"]) == (scheme, num_layers, post_layers, layer_schemes, False)


def lns_train():
    return os.environ.get("LNS_TRAIN_BIN") or os.path.join(ROOT, "build", "lns_train")


def ask_lns_train(args, binary=None):
    """lns_train --print_block_plan ARGS, parsed; ValueError with its one-line error."""
    binary = binary or lns_train()
    if not os.path.isfile(binary):
        raise ValueError(f"the block plan of {' '.join(args)} is not in {os.path.relpath(COMMITTED, ROOT)}: it "
                         f"needs lns_train (LNS_TRAIN_BIN, else build/lns_train; not found: {binary})")
    r = subprocess.run([binary, "--print_block_plan", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        raise ValueError(lines[-1].replace("lns_train: error: ", "") if lines else
                         f"{binary} --print_block_plan: exit status {r.returncode}")
    return json.loads(r.stdout)


@functools.lru_cache(maxsize=None)
def committed():
    try:
        with open(COMMITTED) as f:
            return json.load(f)["plans"]
    except OSError:
        return []


@functools.lru_cache(maxsize=None)
def plan(scheme, num_layers, post_layers=0, layer_schemes=""):
    """The plan of every layer (a tuple of Layer) of a model with these flags."""
    for answer in committed():
        if matches(answer, scheme, num_layers, post_layers, layer_schemes):
            return layers_of(answer)
    return layers_of(ask_lns_train(request(scheme, num_layers, post_layers, layer_schemes)))


def of_shape(s):
    """The plan of a model_shape.ModelShape, refused where the perf models cannot model it."""
    layers = plan(s.scheme, s.L, s.post_layers, s.layer_schemes)
    for l in layers:
        if l.route:
            raise ValueError(f"--norm_scheme={s.scheme}: layer {l.layer} is a routed block (two paths and a "
                             f"gate), which the perf models do not model")
        if any(sub.learned_branch_scale for sub in l.sublayers):
            raise ValueError(f"--norm_scheme={s.scheme}: layer {l.layer} has learned branch scales, which the "
                             f"perf models do not model")
    return layers


def write(binary=None):
    """block_plans.json from lns_train: one plan per model of configs/ (its scheme and
    depth; --post_layers as the perf models read it, 0 where the flagfile has none), a
    layer a line."""
    sys.path.insert(0, HERE)
    from flags import read_flagfile
    keys = []
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if name.endswith(".flags"):
            f = read_flagfile(os.path.join(ROOT, "configs", name))
            k = (f.get("norm_scheme", "lns"), int(f.get("num_layers", 12)), int(f.get("post_layers", 0)),
                 f.get("layer_schemes", ""))
            if k not in keys:
                keys.append(k)
    plans = [ask_lns_train(request(*k), binary) for k in keys]
    lines = ['{"about": "lns_train --print_block_plan for every model of configs/ (python3 tools/perf/block_plan.py '
             '--write); tests/python/test_block_plan.py holds it equal to what lns_train prints",', ' "plans": [']
    for i, p in enumerate(plans):
        head = {k: v for k, v in p.items() if k != "layers"}
        lines.append("  " + json.dumps(head)[:-1] + ', "layers": [')
        lines += ["   " + json.dumps(l) + ("," if j + 1 < len(p["layers"]) else "") for j, l in enumerate(p["layers"])]
        lines.append("  ]}" + ("," if i + 1 < len(plans) else ""))
    lines.append(" ]}")
    with open(COMMITTED + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(COMMITTED + ".tmp", COMMITTED)
    return len(plans)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: block_plan.py --write   (block_plans.json from lns_train: LNS_TRAIN_BIN, else "
                 "build/lns_train)")
    try:
        n = write()
    except ValueError as e:
        sys.exit(f"block_plan.py: {e}")
    print(f"block_plan.py: {n} plans written to {os.path.relpath(COMMITTED, ROOT)}")
