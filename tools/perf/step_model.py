"""Roofline model of one CUDA training step of lns (tp = pp = 1, any dp).

Every kernel and GEMM the CUDA step launches for one micro-batch is listed with its
FLOPs and the bytes it moves to and from device memory, in the order src/model/stage.cpp
runs them. A kernel's roofline time is max(FLOPs / peak, bytes / bandwidth): the time
it cannot beat. Their sum is a *bound* on the micro-batch time, and the MFU it gives
is an upper bound; the real figure can only be lower. Nothing here is a measurement.

Assumptions (each one is a parameter):
- DRAM bytes: each tensor a kernel touches is read or written once (row-sized
  re-reads hit L1/L2). bf16 activations, f32 norm statistics, f32 gradient buffers
  accumulated by the weight-gradient GEMMs (read + write).
- A GEMM whose row pitch (leading dimension x element size) of any operand is not a
  multiple of 16 bytes cannot use Hopper's TMA/wgmma kernels; cuBLASLt falls back to
  Ampere-style kernels with narrow loads. Its compute peak is multiplied by
  `misaligned_efficiency`: 1.0 by default (the pure roofline, blind to this), 0.6 in
  the projection that counts it (an assumption, not a measurement).
- The data-parallel gradient reduction runs on NVLink at the link's per-direction
  bandwidth and overlaps the last micro-batch's backward; what does not fit in that
  backward is exposed. Replicated (`nozero`): a ring all-reduce moves 2(dp-1)/dp of
  the f32 buffer. Sharded (`sharded_adamw`, lns_train's --zero default): each bucket's
  pieces are reduced to their owners one after another, each a pipelined chain that
  takes (piece bytes) / bandwidth, so the whole f32 buffer / bandwidth; after the
  update a ring all-gather of the bf16 weights and the f32 norm gains, (dp-1)/dp of
  them, which nothing hides.
- Optimizer: gradient zeroing (4 B/param), the gradient norm (reads 4 B/param) and
  fused AdamW (reads g, p, m, v; writes p, m, v and the bf16 copy: 30 B/param); norm
  and AdamW over the rank's shard only when sharded.

`Impl` says which of issue 16's changes the modelled code has; `PRESENT` is what the
CUDA code of this tree does, and must be updated together with it.
"""
from dataclasses import dataclass, field, replace

import block_plan
from memory_model import activation_account
# The model's shape lives in model_shape.py (memory_model.py reads it too); named here as
# well, where the tools and tests around this model ask for it.
from model_shape import ModelShape, shape_from_flags  # noqa: F401

BF16, F32, I32 = 2, 4, 4


@dataclass(frozen=True)
class Impl:
    pad_ld: bool = False              # item 1: GEMM dims padded to a multiple of 64 on device
    fused_residual: bool = False      # item 2: pre-norm residual add fused into the next norm
    causal_softmax_bwd: bool = False  # item 6: softmax backward reads only the causal half
    sharded_adamw: bool = False       # item 4: reduce to shard owners, update the shard, all-gather bf16
    norm_bwd_blocks: int = 256        # item 6: norm backward's grid (its [G, C] f32 partials)
    norm_bwd_narrow: bool = False     # that grid grown for rows under 2048 (256 // threads times)
    fused_attention: bool = False     # issue 17: flash_attention.cu (head dims 64, 128)
    fp8: str = "none"                 # issue 30: --fp8 (none, delayed, blockwise) for the blocks' linears


BEFORE = Impl()
# What src/cuda and src/model do in this tree (keep in step with the code): every
# item of issue 16 that changes the model, the sharded update (--zero, the default) included.
PRESENT = Impl(pad_ld=True, fused_residual=True, causal_softmax_bwd=True, sharded_adamw=True,
               norm_bwd_blocks=512, norm_bwd_narrow=True)
# This tree with --zero=false: every dp rank all-reduces and updates all parameters.
NOZERO = replace(PRESENT, sharded_adamw=False)
# issue 17's fused attention on top of this tree (--attention=fused or auto).
FUSED = replace(PRESENT, fused_attention=True)
IMPLS = {"before": BEFORE, "nozero": NOZERO, "present": PRESENT, "fused": FUSED}


def pad64(n):
    return (n + 63) // 64 * 64


@dataclass
class Kernel:
    name: str          # what the CUDA step calls it; repeated kernels share a name
    flops: float
    bytes: float
    gemm: bool = False
    misaligned: bool = False  # a GEMM row pitch not a multiple of 16 bytes
    phase: str = "fwd"        # fwd, bwd
    part: str = "other"       # attention (core), qkvo, mlp, norm, residual, head, embedding
    launches: int = 1
    cublas: bool = False      # a cuBLASLt call, not a kernel of ours (the emulator counts only ours)
    fp8: bool = False         # an FP8 GEMM (--fp8): the device's FP8 peak

    def time(self, dev, misaligned_efficiency):
        if self.fp8 and not dev.fp8_tflops:
            raise ValueError(f"--fp8: the {dev.name} has no FP8 tensor cores")
        peak = (dev.fp8_tflops if self.fp8 else dev.bf16_tflops) * 1e12
        peak *= misaligned_efficiency if self.misaligned else 1.0
        return max(self.flops / peak, self.bytes / (dev.hbm_gbs * 1e9))


def _misaligned(*pitches):
    """pitches: (elements, bytes per element) of each operand's leading dimension."""
    return any(n * e % 16 for n, e in pitches)


class _Builder:
    def __init__(self, s: ModelShape, impl: Impl):
        self.s, self.impl, self.out = s, impl, []
        # The code pads the tensor-parallel GEMM dimensions, FFN width and vocabulary
        # (parallel/shard.h `stored`, gemm_dim_align() = 64 on CUDA); C and the head
        # widths are multiples of 64 in every paper config and are not padded.
        p = pad64 if impl.pad_ld else (lambda n: n)
        self.C, self.F, self.V = s.C, p(s.F), p(s.V)
        self.QD, self.KD = s.QD, s.KD
        self.phase, self.part = "fwd", "other"

    def mem(self, name, nbytes, launches=1, flops=0.0):
        self.out.append(Kernel(name, flops, nbytes, phase=self.phase, part=self.part, launches=launches))

    def gemm(self, name, M, N, K, a=BF16, b=BF16, c=BF16, accumulate=False, pitches=(), batch=1, fp8=False):
        flops = 2.0 * M * N * K * batch
        nbytes = batch * (M * K * a + K * N * b + M * N * c * (2 if accumulate else 1))
        self.out.append(Kernel(name, flops, nbytes, True, _misaligned(*pitches), self.phase, self.part,
                               cublas=True, fp8=fp8))

    def fp8_cast(self, name, read, written):
        """A cast pass of src/cuda/fp8_linear.cpp: reads bf16, writes 1-byte codes (the
        scales, amax and health: a few floats per row or tile, not counted)."""
        part, self.part = self.part, "fp8_cast"
        self.mem(name, BF16 * read + written)
        self.part = part

    # out[N, fo] = x[N, fi] @ W[fo, fi]^T. FP8 (src/cuda/fp8_linear.cpp): x8 cast once per
    # group of linears that read one x (cast_x on the first), w8 cast once per step
    # (StepModel.fp8_weight_cast_bytes), then an FP8 GEMM; its dims are multiples of 16.
    def linear_fwd(self, name, fi, fo, cast_x=True, block=True):
        N = self.s.N
        if self.impl.fp8 == "none" or not block:  # the LM head stays bf16
            self.gemm(name, N, fo, fi, pitches=((fi, BF16), (fi, BF16), (fo, BF16)))
            return
        if cast_x:
            self.fp8_cast(name + ".x8", N * fi, N * fi)
        self.gemm(name, N, fo, fi, a=1, b=1, fp8=True)

    # dx[N, fi] (+)= dy[N, fo] @ W[fo, fi];  dW[fo, fi] += dy^T @ x (f32). FP8: xT8 cast
    # once per group; per linear dy8 and dyT8 (one pass under delayed, a row and a
    # column pass under blockwise), then the two FP8 GEMMs with wT8 and xT8.
    def linear_bwd(self, name, fi, fo, accumulate_dx=False, cast_x=True, block=True):
        N = self.s.N
        if self.impl.fp8 == "none" or not block:
            self.gemm(name + ".dx", N, fi, fo, accumulate=accumulate_dx,
                      pitches=((fo, BF16), (fi, BF16), (fi, BF16)))
            self.gemm(name + ".dw", fo, fi, N, c=F32, accumulate=True,
                      pitches=((fo, BF16), (fi, BF16), (fi, F32)))
            return
        if cast_x:
            self.fp8_cast(name + ".xT8", N * fi, N * fi)
        if self.impl.fp8 == "blockwise":
            self.fp8_cast(name + ".dy8", N * fo, N * fo)
        else:
            self.fp8_cast(name + ".dy8", N * fo, 2 * N * fo)
        self.gemm(name + ".dx", N, fi, fo, a=1, b=1, accumulate=accumulate_dx, fp8=True)
        if self.impl.fp8 == "blockwise":
            self.fp8_cast(name + ".dyT8", N * fo, N * fo)
        self.gemm(name + ".dw", fo, fi, N, a=1, b=1, c=F32, accumulate=True, fp8=True)


def micro_batch_kernels(s: ModelShape, impl: Impl):
    """The kernels of one micro-batch's forward and backward, in launch order."""
    b = _Builder(s, impl)
    N, T, B, L = s.N, s.T, s.B, s.L
    C, F, V, QD, KD = b.C, b.F, b.V, b.QD, b.KD
    Hq, Hkv, D = s.Hq, s.Hkv, s.D
    G, E = Hq // Hkv, B * Hkv
    stats = 2 * F32 * N if s.norm_type == "layernorm" else F32 * N
    norm_fwd = 2 * BF16 * N * C + stats            # x in, u out
    fused_fwd = 4 * BF16 * N * C + stats           # x, delta in; r, u out
    # partials [G, C] written, then summed; narrow rows get more blocks (src/cuda/norm.cu)
    threads = min(max(-(-C // 8 // 32) * 32, 64), 1024)  # block_for(C, 8)
    G_norm = min(N, impl.norm_bwd_blocks * (max(1, 256 // threads) if impl.norm_bwd_narrow else 1))
    norm_bwd = lambda dres: (3 + (1 if dres else 0)) * BF16 * N * C + stats + 2 * G_norm * C * F32
    causal = T * (T + 1) // 2                     # score entries at or below the diagonal
    score = B * Hq * T * T                        # score entries per layer
    fused = impl.fused_attention and D in (64, 128)  # choose_attention_impl(): else materialized
    # Fused kernels (src/cuda/flash_attention.cu): 64 x 64 tiles of (queries, keys) at
    # or below the diagonal are computed whole (the diagonal tile's masked half too);
    # one 2*64*64*D-FLOP product per tile pair and matrix product. Bytes: each tensor
    # read or written once (the K/V re-reads of later query tiles hit L2: one head's
    # K and V are 2*T*D*2 bytes, 1 MiB at T = 4096, D = 64).
    nt = (T + 63) // 64
    tile_flops = B * Hq * (nt * (nt + 1) // 2) * 2.0 * 64 * 64 * D
    lse = F32 * B * Hq * T

    def attention_fwd():
        b.part = "qkvo"
        for n, fo in (("q_proj", QD), ("k_proj", KD), ("v_proj", KD)):
            b.linear_fwd(n, C, fo, cast_x=n == "q_proj")  # one x for the three
        b.part = "attention"
        b.mem("rope", 2 * BF16 * N * (QD + KD), launches=2)
        if fused:  # S = Q K^T, O = P V on chip; reads q, k, v; writes o and lse
            b.out.append(Kernel("flash_fwd", 2 * tile_flops, BF16 * N * (2 * QD + 2 * KD) + lse, True,
                                False, b.phase, b.part))
            b.part = "qkvo"
            b.linear_fwd("o_proj", QD, C)
            return
        b.mem("permute", 2 * BF16 * N * (QD + 2 * KD), launches=3)
        b.gemm("scores", G * T, T, D, c=F32, batch=E, pitches=((D, BF16), (D, BF16), (T, F32)))
        b.mem("softmax", F32 * B * Hq * causal + BF16 * score + F32 * B * Hq * T)
        b.gemm("pv", G * T, D, T, batch=E, pitches=((T, BF16), (D, BF16), (D, BF16)))
        b.mem("permute", 2 * BF16 * N * QD)
        b.part = "qkvo"
        b.linear_fwd("o_proj", QD, C)

    def attention_bwd():
        b.part = "qkvo"
        b.linear_bwd("o_proj", QD, C)
        b.part = "attention"
        if fused:
            b.mem("flash_delta", 2 * BF16 * N * QD + lse)  # delta = rowsum(dO * O)
            # dQ pass: S, dP, dQ per tile pair; reads q, dO, k, v, lse, delta; writes dq
            b.out.append(Kernel("flash_dq", 3 * tile_flops, BF16 * N * (3 * QD + 2 * KD) + 2 * lse, True,
                                False, b.phase, b.part))
            # dK/dV pass: S, dP, dV, dK per tile pair; reads k, v, q, dO, lse, delta; writes dk, dv
            b.out.append(Kernel("flash_dkv", 4 * tile_flops, BF16 * N * (2 * QD + 4 * KD) + 2 * lse, True,
                                False, b.phase, b.part))
        else:
            attention_bwd_materialized()
        b.mem("rope", 2 * BF16 * N * (QD + KD), launches=2)
        b.part = "qkvo"
        b.linear_bwd("q_proj", C, QD)
        b.linear_bwd("k_proj", C, KD, accumulate_dx=True, cast_x=False)
        b.linear_bwd("v_proj", C, KD, accumulate_dx=True, cast_x=False)

    def attention_bwd_materialized():
        b.mem("permute", 2 * BF16 * N * (2 * QD + 2 * KD), launches=4)
        b.gemm("scores", G * T, T, D, c=F32, batch=E, pitches=((D, BF16), (D, BF16), (T, F32)))
        b.gemm("dp", G * T, T, D, c=F32, batch=E, pitches=((D, BF16), (D, BF16), (T, F32)))
        read = causal * B * Hq if impl.causal_softmax_bwd else score
        b.mem("softmax_bwd", 2 * F32 * read + 2 * BF16 * score + F32 * B * Hq * T)
        b.gemm("dv", T, D, G * T, batch=E, pitches=((T, BF16), (D, BF16), (D, BF16)))
        b.gemm("dq", G * T, D, T, batch=E, pitches=((T, BF16), (D, BF16), (D, BF16)))
        b.gemm("dk", T, D, G * T, batch=E, pitches=((T, BF16), (D, BF16), (D, BF16)))
        b.mem("permute", 2 * BF16 * N * (QD + 2 * KD), launches=3)

    def mlp_fwd():
        b.part = "mlp"
        b.linear_fwd("gate_proj", C, F)
        b.linear_fwd("up_proj", C, F, cast_x=False)
        b.mem("swiglu", 3 * BF16 * N * F)
        b.linear_fwd("down_proj", F, C)

    def mlp_bwd():
        b.part = "mlp"
        b.linear_bwd("down_proj", F, C)
        b.mem("swiglu_bwd", 5 * BF16 * N * F)
        b.linear_bwd("gate_proj", C, F)
        b.linear_bwd("up_proj", C, F, accumulate_dx=True, cast_x=False)

    # ---- forward ----
    b.phase, b.part = "fwd", "embedding"
    b.mem("embedding", 2 * BF16 * N * C + I32 * N)
    pending = False  # a residual add waiting to be fused into the next norm
    plan = block_plan.of_shape(s)  # each layer's norms and residual, as lns_train plans them
    for layer in range(L):
        for sub_fwd, sub in zip((attention_fwd, mlp_fwd), plan[layer].sublayers):
            pre, out_norm, add = sub.norms()
            if pre:
                b.part = "norm"
                if pending:
                    b.mem("residual_norm", fused_fwd)
                    pending = False
                else:
                    b.mem("norm", norm_fwd)
            sub_fwd()
            b.part = "norm"
            if out_norm:
                b.mem("norm", norm_fwd)
            if add:
                b.mem("residual_norm", fused_fwd)
            elif impl.fused_residual:
                pending = True
            else:
                b.part = "residual"
                b.mem("copy", 2 * BF16 * N * C)
                b.mem("axpby", 3 * BF16 * N * C)
    b.part = "norm"
    b.mem("residual_norm" if pending else "norm", fused_fwd if pending else norm_fwd)
    b.part = "head"
    b.linear_fwd("lm_head", C, V, block=False)
    # one read of the logits (max and sum-exp in one pass), then the [N] statistics: the
    # local max kept (a copy, not a kernel), the sum rescaled to the max over tp, the
    # losses combined
    b.mem("cross_entropy", BF16 * N * V + 14 * F32 * N, launches=3)

    # ---- backward ----
    b.phase = "bwd"
    b.mem("cross_entropy_bwd", 2 * BF16 * N * V + 3 * F32 * N)
    b.linear_bwd("lm_head", C, V, block=False)
    b.part = "norm"
    b.mem("norm_bwd", norm_bwd(False), launches=2)
    for layer in reversed(range(L)):
        for sub_bwd, sub in zip((mlp_bwd, attention_bwd), reversed(plan[layer].sublayers)):
            pre, out_norm, add = sub.norms()
            alpha_scale = sub.residual_alpha != 1.0  # dr scaled in place (LlamaStage::sublayer_backward)
            b.part = "norm"
            if add:
                b.mem("norm_bwd", norm_bwd(False), launches=2)
            if out_norm:
                b.mem("norm_bwd", norm_bwd(False), launches=2)
            sub_bwd()
            b.part = "norm"
            if alpha_scale:
                b.mem("axpby", 2 * BF16 * N * C)
            if pre:
                b.mem("norm_bwd", norm_bwd(True), launches=2)
            else:
                b.part = "residual"
                b.mem("copy", 2 * BF16 * N * C)
                b.mem("axpby", 3 * BF16 * N * C)
    b.part = "embedding"
    b.mem("embedding_bwd", BF16 * N * C + 2 * F32 * N * C + 4 * I32 * N, launches=2)
    return b.out


@dataclass
class StepModel:
    shape: ModelShape
    impl: Impl
    dev: object
    dp: int = 1
    misaligned_efficiency: float = 1.0
    kernels: list = field(default_factory=list)

    def __post_init__(self):
        if self.dp < 1:
            raise ValueError(f"--dp: expected an integer >= 1, got {self.dp}")
        per_rank = self.shape.B * self.dp
        if self.shape.global_batch % per_rank:
            raise ValueError(f"--global_batch_size: {self.shape.global_batch} is not a multiple of "
                             f"micro_batch_size x dp = {per_rank}")
        if not 0 < self.misaligned_efficiency <= 1:
            raise ValueError("--misaligned_efficiency: expected a value in (0, 1]")
        self.kernels = micro_batch_kernels(self.shape, self.impl)

    def t(self, k):
        return k.time(self.dev, self.misaligned_efficiency)

    # ---- one micro-batch ----
    def gemm_flops(self):
        return sum(k.flops for k in self.kernels if k.gemm)

    def other_bytes(self):
        return sum(k.bytes for k in self.kernels if not k.gemm)

    def micro_batch_time(self):
        return sum(self.t(k) for k in self.kernels)

    def backward_time(self):
        return sum(self.t(k) for k in self.kernels if k.phase == "bwd")

    def share(self, part):
        return sum(self.t(k) for k in self.kernels if k.part == part) / self.micro_batch_time()

    def launches(self):
        return sum(k.launches for k in self.kernels)

    def own_launches(self):
        """Launches of our kernels (LNS_LAUNCH) per micro-batch: what the emulator counts
        (its cuBLASLt stand-in runs GEMMs without a launch); tests/gpu/test_emulator_counts.py
        checks it against lns_bench_step under -DLNS_CUDA_SIM."""
        return sum(k.launches for k in self.kernels if not k.cublas)

    def model_flops_micro_batch(self):
        return self.shape.flops_per_token() * self.shape.N

    def mfu_micro_batch(self):
        return self.model_flops_micro_batch() / (self.micro_batch_time() * self.dev.bf16_tflops * 1e12)

    # ---- one step on one of dp ranks ----
    def num_micro(self):
        return self.shape.global_batch // (self.shape.B * self.dp)

    def stored_shape(self):
        """The shape as the device stores it (padded GEMM dims with pad_ld)."""
        s = self.shape
        return replace(s, V=pad64(s.V), F=pad64(s.F)) if self.impl.pad_ld else s

    def stored_params(self):
        return self.stored_shape().params()

    def optimizer_bytes(self):
        P, dp = self.stored_params(), self.dp
        shard = P / dp if self.impl.sharded_adamw and dp > 1 else P
        # zero the full gradient; norm and AdamW over this rank's part
        return F32 * P + F32 * shard + 30 * shard

    def optimizer_time(self):
        return self.optimizer_bytes() / (self.dev.hbm_gbs * 1e9)

    def fp8_weight_cast_bytes(self):
        """--fp8: each block linear's weight cast once per optimizer step (Fp8State::begin_step):
        bf16 read, w8 and wT8 written (the blockwise tile factors: 1/16384 of that, not counted)."""
        if self.impl.fp8 == "none":
            return 0.0
        s = self.stored_shape()
        per_layer = s.C * (2 * s.QD + 2 * s.KD) + 3 * s.C * s.F  # q, k, v, o; gate, up, down
        return s.L * per_layer * (BF16 + 2)

    def fp8_weight_cast_time(self):
        return self.fp8_weight_cast_bytes() / (self.dev.hbm_gbs * 1e9)

    def comm_time(self):
        """(overlappable with the last backward, exposed after the update) seconds."""
        P, dp, link = self.stored_params(), self.dp, self.dev.link_gbs * 1e9
        if dp == 1:
            return 0.0, 0.0
        ring = (dp - 1) / dp
        if self.impl.sharded_adamw:  # pieces reduced to their owners; all-gather bf16 + f32 gains
            return F32 * P / link, ring * (BF16 * P + F32 * self.shape.norm_params()) / link
        return 2 * ring * F32 * P / link, 0.0  # all-reduce

    def step_time(self):
        overlapped, after = self.comm_time()
        exposed = max(0.0, overlapped - self.backward_time()) + after
        return (self.num_micro() * self.micro_batch_time() + self.optimizer_time() + self.fp8_weight_cast_time() +
                exposed)

    def mfu_step(self):
        flops = self.model_flops_micro_batch() * self.num_micro()
        return flops / (self.step_time() * self.dev.bf16_tflops * 1e12)

    # ---- device memory ----
    def memory(self):
        """Bytes on one rank by category (the planned buffers of LlamaStage and the optimizer).
        Activations: memory_model.activation_account, the one copy of the stage's account."""
        s, P, dp = self.shape, self.stored_params(), self.dp
        b = _Builder(s, self.impl)
        N, C, QD, KD = s.N, b.C, b.QD, b.KD
        shard = P / dp if self.impl.sharded_adamw and dp > 1 else P
        acc = activation_account(replace(s, C=C, F=b.F, V=b.V), 1, 0, s.L, True, True, 1,
                                 align=64 if self.impl.pad_ld else 1)
        G, T = s.Hq // s.Hkv, s.T
        per_entry = G * T * T * 12
        chunk = max(1, min(s.B * s.Hkv, (256 << 20) // per_entry)) * per_entry
        attention_scratch = BF16 * (3 * N * QD + 4 * N * KD) + chunk
        if self.impl.fused_attention and s.D in (64, 128):
            attention_scratch = F32 * s.B * s.Hq * T  # delta only: no permuted copies, no scores
        return {
            # every rank keeps the whole f32 master (the other shards' parts go stale between
            # gathers under ZeRO, and are gathered before a checkpoint)
            "weights (f32 master + bf16 copy)": F32 * P + BF16 * P,
            "gradients (f32)": F32 * P,
            "optimizer state (m, v)": 2 * F32 * shard,
            "activations": acc.slots * acc.per_micro_batch(),
            "workspace": acc.gradients + acc.workspace + attention_scratch + (32 << 20) + 256 * 2 * C * F32,
        }

    def fits(self, reserve_gib=2.0):
        """Footprint within device memory less a reserve (CUDA context, NCCL, allocator)."""
        return sum(self.memory().values()) <= (self.dev.memory_gib - reserve_gib) * 2**30


def largest_micro_batch(shape, impl, dev, dp, reserve_gib=2.0):
    """The largest micro-batch dividing this rank's share of the global batch that fits."""
    per_rank = shape.global_batch // dp
    best = None
    for B in range(1, per_rank + 1):
        if per_rank % B:
            continue
        m = StepModel(replace(shape, B=B), impl, dev, dp)
        if m.fits(reserve_gib):
            best = B
    return best


def gemm_intensity_ok(m: StepModel, margin=2.0):
    """Every linear-layer GEMM (not the per-head attention ones) at >= margin x ridge."""
    return all(k.flops / k.bytes >= margin * m.dev.ridge
               for k in m.kernels if k.gemm and k.part in ("qkvo", "mlp", "head"))


def chosen_micro_batch(shape, impl, dev, dp, reserve_gib=2.0, margin=2.0):
    """The rule for the configs' micro-batch: the smallest one (dividing this rank's share
    of the global batch) whose linear GEMMs are all at least `margin` x the ridge point
    (so they stay compute-bound with room for real GEMM efficiency) and that fits;
    the largest that fits when none reaches the margin."""
    per_rank = shape.global_batch // dp
    for B in range(1, per_rank + 1):
        if per_rank % B:
            continue
        m = StepModel(replace(shape, B=B), impl, dev, dp)
        if m.fits(reserve_gib) and gemm_intensity_ok(m, margin):
            return B
    return largest_micro_batch(shape, impl, dev, dp, reserve_gib)

