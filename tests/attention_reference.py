"""CUDA's flash and memory-efficient attention operators computed on the CPU,
as their kernels define the results (aten/src/ATen/native/transformers/cuda/:
attention.cu, flash_attn/flash_api.cpp, mem_eff_attention/kernel_forward.h):
the reference openreg's kernels (Note [Flash and efficient attention] in
cpp/frontends/flash_efficient_attention.cpp) are compared with where no GPU
is. It shares no code with them: each sequence of each batch element is
attended on its own, with the mask written out per element, in float32 as
both CUDA kernels accumulate (float16/bfloat16 widened).

Dropout's random draws are not reproduced here: with dropout the values are
those without it (a caller compares shapes and dtypes only), unless the
caller passes the draw, `dropout_scale` (dense inputs: (batch, heads, q, k),
1/(1-p) where kept, 0 where dropped). The random-state outputs hold
openreg's values without dropout: 0. `compute_dtype` (float32, as both CUDA
kernels accumulate) is the dtype the reference computes in."""

from __future__ import annotations

import math

import torch


def _band(q_len: int, k_len: int, bottom_right: bool, left: int, right: int) -> torch.Tensor:
    """(q_len, k_len): query i attends key j when -left <= j - i - offset <=
    right (a negative bound is none), offset k_len - q_len when the band's
    diagonal ends at the last key, else 0."""
    offset = k_len - q_len if bottom_right else 0
    allowed = torch.ones(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        for j in range(k_len):
            d = j - i - offset
            if (right >= 0 and d > right) or (left >= 0 and d < -left):
                allowed[i, j] = False
    return allowed


def _attend(q, k, v, scale, allowed, dtype, bias=None, dropout_scale=None):
    """One sequence: q (heads, q_len, d), k/v (kv_heads, k_len, d). Returns
    the output (heads, q_len, dv) and logsumexp (heads, q_len) in `dtype`,
    and which queries attend to no key."""
    groups = q.shape[0] // k.shape[0]
    k = k.to(dtype).repeat_interleave(groups, 0)
    v = v.to(dtype).repeat_interleave(groups, 0)
    scores = q.to(dtype) @ k.transpose(-2, -1) * scale
    if bias is not None:
        scores = scores + bias.to(dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    empty = (scores == -math.inf).all(-1) if scores.shape[-1] else torch.ones(scores.shape[:-1], dtype=torch.bool)
    probabilities = torch.softmax(scores, -1).masked_fill(empty.unsqueeze(-1), 0)
    if dropout_scale is not None:
        probabilities = probabilities * dropout_scale.to(dtype)
    return probabilities @ v, torch.logsumexp(scores, -1), empty


def _scale(scale, head_dim):
    return scale if scale is not None else 1.0 / math.sqrt(head_dim)


def _window(bound):
    return -1 if bound is None or bound < 0 else bound


def flash_attention_forward(query, key, value, cum_seq_q=None, cum_seq_k=None, max_q=0, max_k=0, dropout_p=0.0,
                            is_causal=False, return_debug_mask=False, *, scale=None, window_size_left=None,
                            window_size_right=None, seqused_k=None, alibi_slopes=None, block_table=None,
                            num_splits=None, dropout_scale=None, compute_dtype=torch.float32):
    """aten::_flash_attention_forward: (output, logsumexp, rng_state, unused,
    debug_attn_mask). The band ends at each sequence's last key."""
    assert not return_debug_mask and alibi_slopes is None and block_table is None
    s = _scale(scale, query.shape[-1])
    left, right = _window(window_size_left), 0 if is_causal else _window(window_size_right)
    output = torch.zeros(query.shape[:-1] + (value.shape[-1],), dtype=compute_dtype)
    if cum_seq_q is None:
        batch, q_len, heads, _ = query.shape
        k_len = key.shape[1]
        logsumexp = torch.empty(batch, heads, q_len, dtype=compute_dtype)
        allowed = _band(q_len, k_len, True, left, right)
        for b in range(batch):
            out, lse, empty = _attend(query[b].transpose(0, 1), key[b].transpose(0, 1), value[b].transpose(0, 1),
                                      s, allowed, compute_dtype,
                                      dropout_scale=None if dropout_scale is None else dropout_scale[b])
            output[b] = out.transpose(0, 1)
            logsumexp[b] = lse.masked_fill(empty, math.inf)
    else:
        starts_q, starts_k = cum_seq_q.tolist(), cum_seq_k.tolist()
        used = seqused_k.tolist() if seqused_k is not None else None
        logsumexp = torch.full((query.shape[1], query.shape[0]), math.inf, dtype=compute_dtype)
        for b in range(len(starts_q) - 1):
            q0, q1, k0 = starts_q[b], starts_q[b + 1], starts_k[b]
            k1 = k0 + used[b] if used is not None else starts_k[b + 1]
            allowed = _band(q1 - q0, k1 - k0, True, left, right)
            out, lse, empty = _attend(query[q0:q1].transpose(0, 1), key[k0:k1].transpose(0, 1),
                                      value[k0:k1].transpose(0, 1), s, allowed, compute_dtype)
            output[q0:q1] = out.transpose(0, 1)
            logsumexp[:, q0:q1] = lse.masked_fill(empty, math.inf)
    return (
        output.to(query.dtype),
        logsumexp.float(),
        torch.zeros(2, dtype=torch.uint64),
        torch.zeros((), dtype=torch.uint64),
        torch.empty(0, dtype=query.dtype),
    )


def efficient_attention_forward(query, key, value, bias=None, cu_seqlens_q=None, cu_seqlens_k=None,
                                max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0, custom_mask_type=0,
                                compute_log_sumexp=False, *, scale=None, seqlen_k=None, window_size=None,
                                dropout_scale=None, compute_dtype=torch.float32):
    """aten::_efficient_attention_forward: (output, logsumexp, philox_seed,
    philox_offset, max_seqlen_batch_q, max_seqlen_batch_k). custom_mask_type
    1 is causal from the top left, 2 from the bottom right; the logsumexp's
    rows are padded to a multiple of 32 with +inf."""
    s = _scale(scale, query.shape[-1])
    causal = custom_mask_type != 0
    right = 0 if causal else -1
    left = window_size - 1 if causal and window_size is not None and window_size > 0 else -1
    batch, q_len, heads, _ = query.shape
    output = torch.zeros(batch, q_len, heads, value.shape[-1], dtype=compute_dtype)
    packed = cu_seqlens_q is not None
    rows = max_seqlen_q if packed else q_len
    sequences = [(0, q_len, 0, key.shape[1])] if not packed else [
        (cu_seqlens_q[b].item(), cu_seqlens_q[b + 1].item(), cu_seqlens_k[b].item(),
         cu_seqlens_k[b].item() + seqlen_k[b].item() if seqlen_k is not None else cu_seqlens_k[b + 1].item())
        for b in range(cu_seqlens_q.numel() - 1)]
    width = math.ceil(rows / 32) * 32 if compute_log_sumexp else 0
    logsumexp = torch.full((batch if not packed else len(sequences), heads, width), math.inf, dtype=compute_dtype)
    for b in range(batch):
        for n, (q0, q1, k0, k1) in enumerate(sequences):
            allowed = _band(q1 - q0, k1 - k0, custom_mask_type == 2, left, right)
            out, lse, empty = _attend(query[b, q0:q1].transpose(0, 1), key[b, k0:k1].transpose(0, 1),
                                      value[b, k0:k1].transpose(0, 1), s, allowed, compute_dtype,
                                      None if bias is None else bias[b],
                                      None if dropout_scale is None else dropout_scale[b])
            output[b, q0:q1] = out.transpose(0, 1)
            if width:
                logsumexp[b if not packed else n, :, :q1 - q0] = lse.masked_fill(empty, 0)[:, :width]
    return (
        output.to(query.dtype),
        logsumexp.float(),
        torch.zeros((), dtype=torch.int64),
        torch.zeros((), dtype=torch.int64),
        rows,
        max_seqlen_k if max_seqlen_k is not None else key.shape[1],
    )


# By op_db's OpInfo name.
REFERENCES = {
    "torch.ops.aten._flash_attention_forward": flash_attention_forward,
    "torch.ops.aten._efficient_attention_forward": efficient_attention_forward,
}

# Results CUDA keeps on the host (outside graph capture), by position.
HOST_RESULTS = {"torch.ops.aten._efficient_attention_forward": (2, 3)}

# Where openreg's results may differ from the reference by more than
# torch.testing's defaults: float32 attention over a packed batch sums in
# another order than one sequence at a time, and softmax's exp turns a
# scores' rounding difference of one ulp (op_db's scores reach hundreds)
# into a relative difference of ~1e-5 in the output.
REFERENCE_TOLERANCES = {
    ("torch.ops.aten._efficient_attention_forward", torch.float32): dict(rtol=1e-4, atol=1e-4),
}
