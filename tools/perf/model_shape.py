"""The shape of a LLaMA model as the perf models take it (tools/perf: step_model.py,
memory_model.py, comm_model.py), from lns_train's flags. Its own module so that the
models import it, and each other, one way only (tests/python/test_tool_imports.py). What a
scheme puts in a block comes from lns_train's block plan (block_plan.py), never from
the scheme's name here.
"""
from dataclasses import dataclass

import block_plan
from flags import get_bool, get_int


@dataclass(frozen=True)
class ModelShape:
    V: int
    C: int
    L: int
    Hq: int
    Hkv: int
    F: int
    T: int
    B: int
    global_batch: int
    scheme: str = "lns"
    norm_type: str = "rmsnorm"
    post_layers: int = 0
    tied: bool = False
    layer_schemes: str = ""  # --norm_scheme=hybrid's per-layer forms

    @property
    def D(self):
        return self.C // self.Hq

    @property
    def QD(self):
        return self.Hq * self.D

    @property
    def KD(self):
        return self.Hkv * self.D

    @property
    def N(self):
        return self.B * self.T

    def matmul_params(self):
        per_layer = 2 * self.C * self.QD + 2 * self.C * self.KD + 3 * self.C * self.F
        return self.L * per_layer + self.V * self.C

    def norm(self):
        """Elements of one norm: its gain (and a LayerNorm's bias)."""
        return self.C * (2 if self.norm_type == "layernorm" else 1)

    def block_norms(self, first=0, last=None):
        """Norms the blocks first..last-1 own (their block plans'), final norm not included."""
        layers = block_plan.of_shape(self)
        return sum(len(l.norms) for l in layers[first:self.L if last is None else last])

    def norm_params(self):
        """Norm gains (and LayerNorm biases), final norm included: what kernels read in f32."""
        return (self.block_norms() + 1) * self.norm()

    def params(self):
        """Every parameter (logical, unpadded): the size of the flat buffers."""
        embed = self.V * self.C
        head = 0 if self.tied else self.V * self.C
        per_layer = 2 * self.C * self.QD + 2 * self.C * self.KD + 3 * self.C * self.F
        return embed + head + self.L * per_layer + self.norm_params()

    def flops_per_token(self):
        """Trainer::flops_per_token: 6 x matmul params + 12 L C T (what MFU counts)."""
        return 6 * self.matmul_params() + 12 * self.L * self.C * self.T


def shape_from_flags(flags, micro_batch=None):
    """The shape of these flags; ValueError naming a flag where lns_train would refuse them
    (the scheme's: lns_train's own words) or where the perf models cannot model them."""
    scheme = flags.get("norm_scheme", "lns")
    norm_type = flags.get("norm_type", "rmsnorm")
    if norm_type not in ("rmsnorm", "layernorm"):
        raise ValueError(f"--norm_type: expected rmsnorm or layernorm, got '{norm_type}'")
    s = ModelShape(
        V=get_int(flags, "vocab_size", 32000), C=get_int(flags, "hidden_size", 768),
        L=get_int(flags, "num_layers", 12), Hq=get_int(flags, "num_heads", 12),
        Hkv=get_int(flags, "num_kv_heads", 12), F=get_int(flags, "intermediate_size", 2048),
        T=get_int(flags, "seq_len", 256, hi=1 << 20),
        B=micro_batch if micro_batch else get_int(flags, "micro_batch_size", 8, hi=1 << 20),
        global_batch=get_int(flags, "global_batch_size", 512, hi=1 << 30), scheme=scheme,
        norm_type=norm_type, post_layers=get_int(flags, "post_layers", 0, lo=0),
        tied=get_bool(flags, "tie_embeddings"), layer_schemes=flags.get("layer_schemes", ""))
    if s.C % s.Hq:
        raise ValueError(f"--num_heads: must divide --hidden_size ({s.C}), got {s.Hq}")
    if s.Hq % s.Hkv:
        raise ValueError(f"--num_kv_heads: must divide --num_heads ({s.Hq}), got {s.Hkv}")
    block_plan.of_shape(s)  # the scheme: lns_train's check, and what the models can model
    return s
