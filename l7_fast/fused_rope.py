"""q/k RMSNorm (Qwen3) + RoPE + the paged KV-cache write, as one Triton kernel.

The spec is what happens between the projections and the attention call in stage 1's
``Attention.forward``, followed by stage 3's ``PagedKVCache.set_kv``:

    q, k = q_norm(q), k_norm(k)        Qwen3 only: RMSNorm over each head's D channels
                                       (float32, cast, then * weight: two roundings)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
           x * cos + rotate_half(x) * sin, in the model dtype: each product rounded, then the sum
    K.view(-1, H_kv, D)[slot_mapping] = k;  V.view(-1, H_kv, D)[slot_mapping] = v

With x = [x1, x2] (the two halves of a head, HALF = D / 2), rotate_half(x) = [-x2, x1], so

    out1 = x1 * cos1 - x2 * sin1,   out2 = x2 * cos2 + x1 * sin2       (cos1 == cos2 for HF tables)

The kernel rounds at the same points as torch. cos/sin are the model's own [T, D] tables
(``CausalLM.rope``: float32, then cast to the model dtype), so every layer shares one table and
no cos/sin of Triton's enters. The only float32 difference left is the order of q/k-norm's sum of
squares. Tolerances: fp32 1e-5, fp16 1e-3, bf16 1.5e-2.

    q            [T, H_q, D]    any token / head stride (a view into a fused qkv output is fine)
    k, v         [T, H_kv, D]   same
    cos, sin     [T, D]         model dtype
    q/k_norm_weight [D] or None (Llama, Qwen2: no q/k norm)
    k/v_cache    [num_blocks, block_size, H_kv, D]
    slot_mapping [T] int64      flat slot = block * block_size + offset; slot < 0: do not write
                                (padding rows of a CUDA-graph batch; the torch path has no such rows)
    q_out        [T, H_q, D]    the roped q (may be q itself)

Grid: (cdiv(T, BLOCK_T), cdiv(H_q, BLOCK_H) + cdiv(H_kv, BLOCK_H)). A program owns BLOCK_H heads
of BLOCK_T tokens, as a [BLOCK_T * BLOCK_H, D/2] tile per half (a row per token and head): the first
groups normalise and rope q heads and write them to q_out; the rest do k heads, write them into the
cache and copy v's heads beside them. On a GPU BLOCK_T = BLOCK_H = 1 (one head of one token per
program, as measured below); under the interpreter, which pays for each program and each op rather
than each element, one program takes all heads of a kind for up to 64 tokens. Bytes: read
T(H_q + 2H_kv)D, write the same, plus the [T, D] tables.
On the H200 that grid is the weak point: 26% of copy bandwidth at 4096 tokens (98k one-warp
programs), though 6x faster than the torch path; one program per token over a [heads, D/2] tile
is the next step (benchmarks/results/bench_l7_kernels/h200.md).
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET  # (import before triton: picks GPU or interpreter)
from plumbing.errors import UserError
from l1_dense.model import Attention, apply_rope

import triton
import triton.language as tl

from l3_paged.cache import PagedKVCache
from l3_paged.validate import FLOAT_DTYPES

from .pdl import check_pdl, let_next_start, wait_for_previous


@triton.jit
def _norm_rope(x_ptr, w_ptr, c1, c2, s1, s2, d, ok, inv_d, eps, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """Load heads' halves, optional RMSNorm, then RoPE. Returns both halves. x_ptr [ROWS, 1]: the
    bases of a tile of heads (a row per token and head), d [1, HALF_PAD]; each row is normalised
    on its own. Every product is rounded to the model dtype, as one torch elementwise op rounds
    (written out, not a helper: the interpreter pays per nested call)."""
    x1 = tl.load(x_ptr + d, mask=ok, other=0.0)
    x2 = tl.load(x_ptr + HALF + d, mask=ok, other=0.0)
    dt = x1.dtype
    if HAS_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = tl.math.rsqrt((tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) * inv_d + eps)[:, None]
        w1 = tl.load(w_ptr + d, mask=d < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
        x1 = ((f1 * rstd).to(dt).to(tl.float32) * w1).to(dt)              # normalise, round; * weight, round
        x2 = ((f2 * rstd).to(dt).to(tl.float32) * w2).to(dt)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (a1 * c1.to(tl.float32)).to(dt).to(tl.float32) - (a2 * s1.to(tl.float32)).to(dt).to(tl.float32)
    o2 = (a2 * c2.to(tl.float32)).to(dt).to(tl.float32) + (a1 * s2.to(tl.float32)).to(dt).to(tl.float32)
    return o1.to(dt), o2.to(dt)


@triton.jit(do_not_specialize=["T"])   # the token count: a runtime int, no variant per T
def _qk_norm_rope_write_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                               qo_ptr, kc_ptr, vc_ptr, slot_ptr, inv_d, eps, T, H_q, H_kv,
                               stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                               stride_ct, stride_st, stride_ot, stride_oh,
                               stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                               BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                               HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                               PDL: tl.constexpr):
    let_next_start(PDL)                 # pdl.py: the attention kernel may launch now, and waits for us
    wait_for_previous(PDL)              # q, k, v come from the qkv matmul
    g = tl.program_id(1)                                                # a group of BLOCK_H heads
    r = tl.arange(0, BLOCK_T * BLOCK_H)[:, None]                        # rows: BLOCK_T tokens x BLOCK_H heads
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + r // BLOCK_H          # [ROWS, 1] each row's token
    j = r % BLOCK_H                                                     # [ROWS, 1] its head in the group
    d = tl.arange(0, HALF_PAD)[None, :]                                 # [1, HALF_PAD]
    in_t = (t < T) & (d < HALF)
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=in_t, other=0.0)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=in_t, other=0.0)
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=in_t, other=0.0)
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=in_t, other=0.0)
    q_groups = tl.cdiv(H_q, BLOCK_H)
    if g < q_groups:                                                    # q heads
        h = g * BLOCK_H + j
        ok = (h < H_q) & in_t
        o1, o2 = _norm_rope(q_ptr + t * stride_qt + h * stride_qh, qw_ptr, c1, c2, s1, s2, d, ok,
                            inv_d, eps, HALF, HAS_NORM)
        dst = qo_ptr + t * stride_ot + h * stride_oh
        tl.store(dst + d, o1, mask=ok)
        tl.store(dst + HALF + d, o2, mask=ok)
    else:                                                               # kv heads: k roped, v as is
        kh = (g - q_groups) * BLOCK_H + j
        slot = tl.load(slot_ptr + t, mask=t < T, other=-1)              # [ROWS, 1]
        ok = (kh < H_kv) & in_t & (slot >= 0)                           # slot < 0: a padding row, no write
        o1, o2 = _norm_rope(k_ptr + t * stride_kt + kh * stride_kh, kw_ptr, c1, c2, s1, s2, d, ok,
                            inv_d, eps, HALF, HAS_NORM)
        blk, off = slot // BLOCK_SIZE, slot % BLOCK_SIZE                # flat slot -> (block, offset)
        kc = kc_ptr + blk * stride_kcb + off * stride_kcs + kh * stride_kch
        tl.store(kc + d, o1, mask=ok)
        tl.store(kc + HALF + d, o2, mask=ok)
        v_src = v_ptr + t * stride_vt + kh * stride_vh
        vc = vc_ptr + blk * stride_vcb + off * stride_vcs + kh * stride_vch
        tl.store(vc + d, tl.load(v_src + d, mask=ok), mask=ok)
        tl.store(vc + HALF + d, tl.load(v_src + HALF + d, mask=ok), mask=ok)


def _heads_per_program(H_q: int, H_kv: int) -> int:
    """BLOCK_H. On a GPU one head per program (the measured layout). The interpreter pays per
    program and per op, not per element: there one program takes every head of its kind."""
    return triton.next_power_of_2(max(H_q, H_kv)) if INTERPRET else 1


def _tokens_per_program(T: int) -> int:
    """BLOCK_T. On a GPU one token per program. Under the interpreter up to 64 tokens (a prompt's
    prefill was one program per token: 17 of the 42 s of a CPU ``l7_smoke.py``)."""
    return min(64, triton.next_power_of_2(T)) if INTERPRET else 1


def _need(ok, message):
    """``message`` is a lambda: the f-strings are built only on failure (this runs every layer)."""
    if not ok:
        raise UserError(message())


def qk_norm_rope_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, *, q_norm_weight=None,
                       k_norm_weight=None, eps=1e-6, q_out=None, heads_per_program: int | None = None,
                       tokens_per_program: int | None = None, pdl: bool = False):
    """Norm (if weights are given) and rope q and k, write k and v into the paged cache at
    ``slot_mapping``. Returns the roped q ``[T, H_q, D]`` (``q_out``, which may be ``q``).
    ``heads_per_program`` / ``tokens_per_program``: BLOCK_H / BLOCK_T instead of the defaults (tests
    run the GPU's 1 and 1 on a CPU). ``pdl``: launched with programmatic dependent launch (pdl.py)."""
    _need(q.dim() == 3 and k.dim() == 3 and v.shape == k.shape,
          lambda: f"q must be [T, H_q, D], k and v [T, H_kv, D]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                  f"{tuple(v.shape)}")
    T, H_q, D = q.shape
    _need(k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
          lambda: f"k/v_cache must be [num_blocks, block_size, H_kv, D], got {tuple(k_cache.shape)}, "
                  f"{tuple(v_cache.shape)}")
    _, block_size, H_kv, _ = k_cache.shape
    _need(k.shape == (T, H_kv, D), lambda: f"k is {tuple(k.shape)}, the cache wants [T={T}, H_kv={H_kv}, D={D}]")
    _need(D % 2 == 0 and cos.shape == (T, D) and sin.shape == (T, D),
          lambda: f"cos/sin must be [T, D] = [{T}, {D}] with D even, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    _need(q.dtype in FLOAT_DTYPES, lambda: f"q dtype {q.dtype} unsupported: use float32, float16 or bfloat16")
    _need((q_norm_weight is None) == (k_norm_weight is None), lambda: "pass both q/k norm weights or neither")
    norm_w = () if q_norm_weight is None else (q_norm_weight, k_norm_weight)
    for name, t in (("k", k), ("v", v), ("cos", cos), ("sin", sin), ("k_cache", k_cache),
                    ("v_cache", v_cache)) + tuple(zip(("q_norm_weight", "k_norm_weight"), norm_w)):
        _need(t.dtype == q.dtype and t.device == q.device,
              lambda: f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device} (one model dtype)")
        _need(t.stride(-1) == 1, lambda: f"{name} must have stride(-1) == 1, got strides {t.stride()}")
    for w in norm_w:
        _need(w.shape == (D,), lambda: f"q/k norm weights must be [D={D}], got {tuple(w.shape)}")
    _need(slot_mapping.shape == (T,) and slot_mapping.dtype == torch.int64 and slot_mapping.device == q.device,
          lambda: f"slot_mapping must be [T={T}] int64 on {q.device}, got {tuple(slot_mapping.shape)} "
                  f"{slot_mapping.dtype}")
    _need(q.stride(-1) == 1, lambda: f"q must have stride(-1) == 1, got strides {q.stride()}")
    q_out = torch.empty(T, H_q, D, dtype=q.dtype, device=q.device) if q_out is None else q_out
    _need(q_out.shape == q.shape and q_out.dtype == q.dtype and q_out.stride(-1) == 1,
          lambda: f"q_out must be [T, H_q, D] {q.dtype} with stride(-1) == 1, got {tuple(q_out.shape)} {q_out.dtype}")
    check_pdl(pdl, q.device)
    if T == 0:
        return q_out
    qw, kw = norm_w or (q, q)                                          # unused without HAS_NORM
    bh = heads_per_program or _heads_per_program(H_q, H_kv)
    _need(bh & (bh - 1) == 0, lambda: f"heads_per_program must be a power of two, got {bh}")
    bt = tokens_per_program or _tokens_per_program(T)
    _need(bt & (bt - 1) == 0, lambda: f"tokens_per_program must be a power of two, got {bt}")
    _qk_norm_rope_write_kernel[(triton.cdiv(T, bt), triton.cdiv(H_q, bh) + triton.cdiv(H_kv, bh))](
        q, k, v, cos, sin, qw, kw, q_out, k_cache, v_cache, slot_mapping, 1.0 / D, float(eps), T, H_q, H_kv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0), q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, HALF=D // 2, HALF_PAD=triton.next_power_of_2(D // 2),
        HAS_NORM=bool(norm_w), BLOCK_H=bh, BLOCK_T=bt, PDL=pdl, num_warps=1 if D <= 128 else 2, launch_pdl=pdl,
        # No fma: with fusion on (Triton's default) the GPU computed x1*cos1 - x2*sin1 with one
        # rounding instead of three, and only ~80% of bf16/fp16 elements matched torch (H200).
        enable_fp_fusion=False)
    return q_out


def qk_norm_rope_write_ref(attn: Attention, q, k, v, cos, sin, kv: PagedKVCache, slot_mapping):
    """The torch path: Attention.forward from the projections to the attention call, then set_kv.
    Each torch op below reads and writes the whole [T, H, D] tensor once or more."""
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    kv.set_kv(attn.layer_idx, slot_mapping, k, v)
    return q


def rope_case(cfg, T, device, dtype, *, num_blocks, block_size=16, seed=0):
    """A random case for tests and the benchmark: the layer (random q/k-norm weights), q/k/v as
    views of one fused [T, (H_q + 2 H_kv) D] projection, the model's cos/sin for random positions,
    two identical NaN-filled caches (one per path) and shuffled distinct slots."""
    from types import SimpleNamespace

    from l1_dense.model import CausalLM, rope_inv_freq
    torch.manual_seed(seed)
    attn = Attention(cfg, 0).to(device=device, dtype=dtype).requires_grad_(False)
    if cfg.qk_norm:
        attn.q_norm.weight.copy_(torch.randn(cfg.head_dim))
        attn.k_norm.weight.copy_(torch.randn(cfg.head_dim))
    H_q, H_kv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = torch.randn(T, (H_q + 2 * H_kv) * D, device=device).to(dtype)   # [T, (H_q + 2 H_kv) D]
    q = qkv[:, :H_q * D].view(T, H_q, D)
    k = qkv[:, H_q * D:(H_q + H_kv) * D].view(T, H_kv, D)
    v = qkv[:, (H_q + H_kv) * D:].view(T, H_kv, D)
    positions = torch.randint(0, cfg.max_position_embeddings, (T,), device=device)
    # the model's own table code, without building a model (it reads only inv_freq)
    cos, sin = CausalLM.rope(SimpleNamespace(inv_freq=rope_inv_freq(cfg).to(device)), positions, dtype)
    caches = [PagedKVCache(cfg, num_blocks, block_size, device, dtype) for _ in range(2)]
    for c in caches:
        c.K[0].fill_(float("nan"))
        c.V[0].fill_(float("nan"))
    slots = torch.randperm(num_blocks * block_size, device=device)[:T]    # [T] int64, distinct
    return attn, (q, k, v, cos, sin), caches, slots
