// CUDA's flash and memory-efficient attention operators on openreg.
//
// Note [Flash and efficient attention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// aten::_flash_attention_forward/_backward and
// aten::_efficient_attention_forward/_backward have CUDA kernels and no CPU
// kernel: sdpa reaches them only on CUDA (openreg answers OVERRIDEABLE, Note
// [Fused attention]), but libraries call them by name (torch.ops.aten, the
// torch.nn.attention.varlen.varlen_attn front end, xformers-style code), and
// autograd's derivatives map each forward to its backward. openreg
// implements them, and _flash_attention_forward_no_dropout_inplace (varlen_attn's
// out= form), on the math route (math_attention.h), with CUDA's schemas,
// argument checks, result shapes, dtypes and layouts (aten/src/ATen/native/
// transformers/cuda/attention.cu, attention_backward.cu, flash_attn/flash_api.cpp,
// mem_eff_attention/kernel_forward.h and kernel_backward.h):
//  - layout: query/key/value are (batch, seqlen, heads, head_dim), or packed
//    variable-length batches: (total, heads, head_dim) for flash with
//    cum_seq_q/cum_seq_k, (1, total, heads, head_dim) for efficient with
//    cu_seqlens_q/cu_seqlens_k, the int32 offsets of each sequence. A packed
//    batch computes as one dense problem over all tokens whose mask keeps
//    each query to the keys of its own sequence; a token outside every
//    sequence attends to nothing. Fewer key/value heads than query heads
//    (a divisor) is grouped-query attention, as both kernels allow.
//  - masks: flash's is_causal and window_size_left/right bound the keys
//    around the diagonal that ends at each sequence's last key (flash-attn's
//    bottom-right alignment; -1 is unbounded); efficient's custom_mask_type
//    is 0 (none), 1 (causal from the top left) or 2 (causal from the bottom
//    right), and window_size > 0 keeps the last window_size keys up to the
//    diagonal (causal types only, as CUDA requires). seqused_k (flash) and
//    seqlen_k (efficient) cut each packed sequence's keys (forward only:
//    autograd does not pass them to the backward, on CUDA either);
//    efficient's dense kernel ignores seqlen_k, as CUDA's does. The bias of
//    efficient attention is additive, (batch, heads, seqlen_q, seqlen_k) in
//    the query's dtype, and gets its gradient when bias_requires_grad.
//  - a query that attends to no key has output 0, and logsumexp +inf
//    (flash) or 0 (efficient), as their kernels write them.
//  - logsumexp: flash's is (batch, heads, seqlen_q), or (heads, total_q)
//    packed; efficient's is (batch or sequences, heads, L) with L the query
//    length (max_seqlen_q when packed) rounded up to a multiple of 32, the
//    padding +inf (kAlignLSE of the CUDA kernel), or L = 0 without
//    compute_log_sumexp. The backward does not read it: it recomputes the
//    probabilities.
//  - dropout draws from the openreg device generator (Note [Philox
//    offsets]); the draw's Philox seed and offset are returned, and the
//    backward draws the same mask from them: flash returns them as
//    rng_state, a (2,) uint64 device tensor [seed, offset] (and `unused`, a
//    ()-shaped uint64 zero), efficient as philox_seed and philox_offset,
//    int64 scalar CPU tensors, as CUDA keeps them on the host outside graph
//    capture; without dropout they hold 0 (CUDA leaves them uninitialized).
//    The draw is bernoulli_(1 - p) of a float32 tensor of the scores' shape,
//    (batch, heads, q, k) (one batch of all packed tokens), from a generator
//    at that seed and offset. The mask is not CUDA's (other random numbers),
//    only distributed as CUDA's.
//  - flash's debug_attn_mask (return_debug_mask, which CUDA allows only with
//    dropout) holds the attention probabilities negated where dropout
//    dropped them (CUDA's kernel encodes the mask in the sign), zero-padded
//    to (batch, heads, seqlen_q, seqlen_k) rounded up to multiples of 128
//    (max_q and max_k for packed sequences), in the query's dtype;
//    otherwise it is empty. max_q/max_k do nothing else (the dense kernel
//    ignores them; packed, the offsets say the lengths); efficient returns
//    max_seqlen_batch_q (max_seqlen_q packed, else seqlen_q) and
//    max_seqlen_batch_k (max_seqlen_k when given, else seqlen_k), as CUDA.
//  - not supported, with a NotImplementedError naming the argument: flash's
//    block_table (a paged key/value cache), seqused_k without packed
//    sequences, and efficient's bias with cu_seqlens_q (CUDA's backward
//    refuses it). alibi_slopes is refused as CUDA's build refuses it;
//    num_splits/num_splits_key only choose how CUDA splits the work.
// Results are computed in float (float16/bfloat16 widened) and written to
// outputs allocated as CUDA allocates them (flash: empty_like its inputs;
// efficient: contiguous, grad_bias padded to 16 in its last dimension).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "torch_openreg/cpp/frontends/math_attention.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// ---- Which keys each query attends to ----

// The tokens of one side (queries or keys) of a problem: each token's
// sequence and position in it, and each sequence's start and length (the
// tokens that take part). A dense side is one sequence, shared by every
// batch element; a packed side has its sequences one after another.
struct Tokens {
  at::Tensor sequence; // (tokens,) int64, clamped into [0, sequences)
  at::Tensor position; // (tokens,) int64; outside [0, length) for a token of no sequence
  at::Tensor starts;   // (sequences,) int64
  at::Tensor lengths;  // (sequences,) int64
};

Tokens dense_tokens(int64_t count, const c10::TensorOptions& long_options) {
  Tokens tokens;
  tokens.position = at::arange(count, long_options);
  tokens.sequence = at::zeros({count}, long_options);
  tokens.starts = at::zeros({1}, long_options);
  tokens.lengths = at::full({1}, count, long_options);
  return tokens;
}

// `cu_seqlens` (int32, sequences + 1) holds the offsets of the sequences;
// `used_lengths` (int32, sequences), when defined, how many of each
// sequence's tokens take part (seqused_k, seqlen_k).
Tokens packed_tokens(const at::Tensor& cu_seqlens, int64_t total, const at::Tensor& used_lengths) {
  const at::Tensor offsets = cu_seqlens.to(at::kLong);
  const int64_t sequences = offsets.numel() - 1;
  const at::Tensor index = at::arange(total, offsets.options());
  Tokens tokens;
  if (sequences == 0) {
    // No sequence: every token in none, as of one empty sequence.
    tokens.starts = at::zeros({1}, offsets.options());
    tokens.lengths = at::zeros({1}, offsets.options());
    tokens.sequence = at::zeros({total}, offsets.options());
    tokens.position = index;
    return tokens;
  }
  tokens.starts = offsets.slice(0, 0, sequences);
  tokens.lengths = used_lengths.defined() ? used_lengths.to(at::kLong) : offsets.slice(0, 1) - tokens.starts;
  tokens.sequence = at::searchsorted(offsets.slice(0, 1), index, /*out_int32=*/false, /*right=*/true)
                        .clamp_max(sequences - 1);
  tokens.position = index - offsets.index_select(0, tokens.sequence);
  return tokens;
}

// The keys a query attends to around its sequence's diagonal: with d = key
// position - query position - offset, where the offset is 0 (the diagonal
// starts at the first key) or key length - query length (it ends at the last
// key), a query attends to the keys with -left <= d <= right (-1: unbounded).
struct Band {
  bool bottom_right = false;
  int64_t left = -1;
  int64_t right = -1;

  bool bounded() const {
    return left >= 0 || right >= 0;
  }
};

// (1, 1, query tokens, key tokens) bool: true where a query attends to a key.
at::Tensor keep_mask(const Tokens& queries, const Tokens& keys, const Band& band) {
  const at::Tensor query_length = queries.lengths.index_select(0, queries.sequence);
  const at::Tensor key_length = keys.lengths.index_select(0, keys.sequence);
  const at::Tensor query_in = (queries.position >= 0) & (queries.position < query_length);
  const at::Tensor key_in = (keys.position >= 0) & (keys.position < key_length);
  at::Tensor keep = (queries.sequence.unsqueeze(1) == keys.sequence.unsqueeze(0)) & query_in.unsqueeze(1) &
      key_in.unsqueeze(0);
  if (band.bounded()) {
    at::Tensor diagonal = queries.position;
    if (band.bottom_right) {
      diagonal = diagonal + keys.lengths.index_select(0, queries.sequence) - query_length;
    }
    const at::Tensor from_diagonal = keys.position.unsqueeze(0) - diagonal.unsqueeze(1);
    if (band.right >= 0) {
      keep = keep & (from_diagonal <= band.right);
    }
    if (band.left >= 0) {
      keep = keep & (from_diagonal >= -band.left);
    }
  }
  return keep.unsqueeze(0).unsqueeze(0);
}

// For each packed sequence, `width` slots: the indices of its first tokens
// (clamped into the `total` tokens) and whether each is one of its tokens.
struct SequenceSlots {
  at::Tensor index; // (sequences, width) int64
  at::Tensor valid; // (sequences, width) bool
};

SequenceSlots sequence_slots(const Tokens& tokens, int64_t width, int64_t total) {
  const at::Tensor offsets = at::arange(width, tokens.starts.options());
  return {(tokens.starts.unsqueeze(1) + offsets).clamp(0, std::max<int64_t>(total - 1, 0)),
          offsets.unsqueeze(0) < tokens.lengths.unsqueeze(1)};
}

// ---- The math of a problem ----

// A problem in the math route's layout, (batch, heads, tokens, head_dim).
struct Problem {
  at::Tensor query;
  at::Tensor key;
  at::Tensor value;
  at::Tensor keep; // bool, broadcast to (batch, heads, q, k); undefined: every key
  at::Tensor bias; // additive, (batch, heads, q, k); undefined: none
  std::optional<double> scale;
};

// (batch, seqlen, heads, dim), or packed (total, heads, dim), as heads first.
at::Tensor heads_first(const at::Tensor& t, bool packed) {
  return packed ? t.unsqueeze(0).transpose(1, 2) : t.transpose(1, 2);
}

at::Tensor heads_second(const at::Tensor& t, bool packed) {
  return packed ? t.transpose(1, 2).squeeze(0) : t.transpose(1, 2);
}

// The problem's probabilities: a query that attends to no key gets 0 (where
// softmax gives NaN), as both CUDA kernels give it.
MathAttention attend(const Problem& problem) {
  at::Tensor bias = problem.bias;
  if (problem.keep.defined()) {
    bias = bias.defined() ? bias.masked_fill(problem.keep.logical_not(), -kInfinity) : problem.keep;
  }
  MathAttention math = math_attention(problem.query, problem.key, problem.value, bias, false, problem.scale);
  if (math.scores.size(-1) > 0) {
    math.probabilities = math.probabilities.masked_fill(math.scores.amax(-1, /*keepdim=*/true) == -kInfinity, 0);
  }
  return math;
}

struct Forward {
  MathAttention math;
  at::Tensor output;     // (batch, heads, q, value head_dim), widened
  at::Tensor logsumexp;  // (batch, heads, q) float; -inf where a query attends to no key
  at::Tensor keep_scale; // the dropout draw; undefined without dropout
  uint64_t seed = 0;
  uint64_t offset = 0;
};

Forward forward(const Problem& problem, double dropout_p) {
  Forward result;
  result.math = attend(problem);
  at::Tensor probabilities = result.math.probabilities;
  if (dropout_p > 0.0) {
    DropoutDraw draw = draw_dropout(probabilities, dropout_p);
    result.keep_scale = draw.keep_scale;
    result.seed = draw.seed;
    result.offset = draw.offset;
    probabilities = probabilities * draw.keep_scale;
  }
  result.output = at::matmul(probabilities, result.math.value);
  result.logsumexp = at::logsumexp(result.math.scores, -1).to(at::kFloat);
  return result;
}

MathAttentionGrads backward(const Problem& problem, const at::Tensor& grad_out, double dropout_p, uint64_t seed,
                            uint64_t offset) {
  MathAttention math = attend(problem);
  const at::Tensor keep_scale =
      dropout_p > 0.0 ? redraw_dropout(math.probabilities, dropout_p, seed, offset) : at::Tensor();
  return math_attention_backward(math, grad_out, problem.query, problem.key, problem.value, keep_scale);
}

// ---- Argument checks shared by the operators ----

void check_same_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& query) {
  TORCH_CHECK(t.device() == query.device(), op, ": ", name, " must be on ", query.device(), " (as query), got ",
              t.device());
}

void check_dropout(const char* op, double dropout_p) {
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ", dropout_p);
}

// An int32 offsets tensor of packed sequences (cu_seqlens), as CUDA checks it.
void check_offsets(const char* op, const char* name, const at::Tensor& offsets, const at::Tensor& query) {
  check_same_device(op, name, offsets, query);
  TORCH_CHECK(offsets.scalar_type() == at::kInt, op, ": ", name, " must have dtype int32, got ",
              offsets.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.numel() >= 1, op, ": ", name,
              " must be 1-D (batch_size + 1 offsets), got shape ", offsets.sizes());
  TORCH_CHECK(offsets.is_contiguous(), op, ": ", name, " must be contiguous");
}

// Per-sequence lengths (seqused_k, seqlen_k): int32, one per sequence.
void check_lengths(const char* op, const char* name, const at::Tensor& lengths, int64_t sequences,
                   const at::Tensor& query) {
  check_same_device(op, name, lengths, query);
  TORCH_CHECK(lengths.scalar_type() == at::kInt, op, ": ", name, " must have dtype int32, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == sequences, op, ": ", name, " must have shape (",
              sequences, "), one length per sequence, got ", lengths.sizes());
}

void check_last_dim_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.numel() == 0 || t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", name,
              ": last dimension must be contiguous");
}

// ---- Flash attention ----

constexpr const char* kFlashForward = "_flash_attention_forward";
constexpr const char* kFlashBackward = "_flash_attention_backward";

int64_t window_bound(const std::optional<c10::SymInt>& window) {
  const int64_t bound = window.has_value() ? window->expect_int() : -1;
  return bound < 0 ? -1 : bound;
}

// query/key/value as CUDA's mha_fwd/mha_varlen_fwd (and their backward)
// check them: float16/bfloat16 of one dtype, (batch, seqlen, heads,
// head_dim) or packed (total, heads, head_dim), one head size, a multiple of
// 8 and at most 256, key/value heads dividing the query heads.
void check_flash_inputs(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                        const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, bool backward) {
  TORCH_CHECK(cum_seq_q.defined() == cum_seq_k.defined(), op,
              ": cumulative_sequence_length_q and cumulative_sequence_length_k must be both set or both not set");
  TORCH_CHECK(query.is_privateuseone(), op, ": query must be an openreg tensor, got one on ", query.device());
  check_same_device(op, "key", key, query);
  check_same_device(op, "value", value, query);
  TORCH_CHECK(query.scalar_type() == at::kHalf || query.scalar_type() == at::kBFloat16,
              "FlashAttention only support fp16 and bf16 data type");
  TORCH_CHECK(key.scalar_type() == query.scalar_type(), "query and key must have the same dtype");
  TORCH_CHECK(value.scalar_type() == query.scalar_type(), "query and value must have the same dtype");
  const bool packed = cum_seq_q.defined();
  const int64_t rank = packed ? 3 : 4;
  const char* layout = packed ? "(total, num_heads, head_size) with cum_seq_q/cum_seq_k"
                              : "(batch_size, seqlen, num_heads, head_size)";
  for (const auto& [name, t] : {std::pair{"query", &query}, std::pair{"key", &key}, std::pair{"value", &value}}) {
    TORCH_CHECK(t->dim() == rank, op, ": ", name, " must be ", rank, "-D ", layout, ", got ", t->dim(), "-D");
    check_last_dim_contiguous(op, name, *t);
  }
  const int64_t head_size = query.size(-1);
  TORCH_CHECK(head_size % 8 == 0, backward ? "head_size_og should be a multiple of 8, this is ensured by padding!"
                                            : "head_size must be a multiple of 8, this is ensured by padding!");
  TORCH_CHECK(head_size <= 256, backward ? "FlashAttention backward only supports head dimension at most 256"
                                         : "FlashAttention forward only supports head dimension at most 256");
  const int64_t heads = query.size(-2);
  const int64_t key_heads = key.size(-2);
  TORCH_CHECK(key_heads > 0 && heads % key_heads == 0,
              "Number of heads in key/value must divide number of heads in query");
  TORCH_CHECK(key.size(-1) == head_size && value.size(-1) == head_size && value.size(-2) == key_heads &&
                  value.size(-3) == key.size(-3),
              op, ": key and value must have shape ",
              packed ? "(total_k, num_heads_k, head_size)" : "(batch_size, seqlen_k, num_heads_k, head_size)",
              " with the query's head_size ", head_size, ", got key ", key.sizes(), " and value ", value.sizes());
  if (packed) {
    check_offsets(op, "cu_seqlens_q", cum_seq_q, query);
    check_offsets(op, "cu_seqlens_k", cum_seq_k, query);
    TORCH_CHECK(cum_seq_k.numel() == cum_seq_q.numel(), "cu_seqlens_k must have shape (batch_size + 1)");
  } else {
    TORCH_CHECK(key.size(0) == query.size(0), op, ": key must have the query's batch size ", query.size(0),
                ", got ", key.size(0));
  }
}

Problem flash_problem(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, const at::Tensor& seqused_k,
                      bool is_causal, const std::optional<c10::SymInt>& window_size_left,
                      const std::optional<c10::SymInt>& window_size_right, std::optional<double> scale) {
  const bool packed = cum_seq_q.defined();
  Problem problem{heads_first(query, packed), heads_first(key, packed), heads_first(value, packed), {}, {}, scale};
  Band band;
  band.bottom_right = true;
  band.left = window_bound(window_size_left);
  band.right = is_causal ? 0 : window_bound(window_size_right);
  const auto long_options = query.options().dtype(at::kLong);
  if (packed) {
    problem.keep = keep_mask(packed_tokens(cum_seq_q, query.size(0), at::Tensor()),
                             packed_tokens(cum_seq_k, key.size(0), seqused_k), band);
  } else if (band.bounded()) {
    problem.keep =
        keep_mask(dense_tokens(query.size(1), long_options), dense_tokens(key.size(1), long_options), band);
  }
  return problem;
}

// flash's debug mask: see the Note.
at::Tensor flash_debug_mask(const Forward& result, const at::Tensor& query, const at::Tensor& cum_seq_q,
                            const at::Tensor& cum_seq_k, int64_t max_q, int64_t max_k) {
  const at::Tensor& p = result.math.probabilities; // (batch, heads, q, k)
  const at::Tensor signed_p = at::where(result.keep_scale > 0, p, -p);
  if (!cum_seq_q.defined()) {
    const int64_t q = p.size(-2), k = p.size(-1);
    return at::constant_pad_nd(signed_p, {0, round_up(k, 128) - k, 0, round_up(q, 128) - q}, 0)
        .to(query.scalar_type());
  }
  // One (heads, max_q, max_k) block per sequence, cut from the packed problem.
  const int64_t width_q = round_up(max_q, 128), width_k = round_up(max_k, 128);
  const int64_t sequences = cum_seq_q.numel() - 1, heads = p.size(1);
  const int64_t total_q = p.size(-2), total_k = p.size(-1);
  if (sequences == 0 || total_q == 0 || total_k == 0) {
    return at::zeros({sequences, heads, width_q, width_k}, query.options());
  }
  const SequenceSlots rows = sequence_slots(packed_tokens(cum_seq_q, total_q, at::Tensor()), width_q, total_q);
  const SequenceSlots cols = sequence_slots(packed_tokens(cum_seq_k, total_k, at::Tensor()), width_k, total_k);
  at::Tensor by_rows = signed_p.select(0, 0).index_select(1, rows.index.flatten()).view({heads, sequences, width_q,
                                                                                          total_k});
  at::Tensor blocks = at::gather(by_rows, 3, cols.index.view({1, sequences, 1, width_k}).expand({heads, sequences,
                                                                                                  width_q, width_k}));
  const at::Tensor valid = rows.valid.view({1, sequences, width_q, 1}) & cols.valid.view({1, sequences, 1, width_k});
  return blocks.masked_fill(valid.logical_not(), 0).permute({1, 0, 2, 3}).to(query.scalar_type()).contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_forward(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& cum_seq_q_opt,
    const std::optional<at::Tensor>& cum_seq_k_opt,
    c10::SymInt max_q,
    c10::SymInt max_k,
    double dropout_p,
    bool is_causal,
    bool return_debug_mask,
    std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left,
    std::optional<c10::SymInt> window_size_right,
    const std::optional<at::Tensor>& seqused_k_opt,
    const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& block_table,
    std::optional<int64_t> num_splits) {
  const char* op = kFlashForward;
  const at::Tensor cum_seq_q = cum_seq_q_opt.value_or(at::Tensor());
  const at::Tensor cum_seq_k = cum_seq_k_opt.value_or(at::Tensor());
  const at::Tensor seqused_k = seqused_k_opt.value_or(at::Tensor());
  TORCH_CHECK(!(alibi_slopes.has_value() && alibi_slopes->defined()), "This flash attention build does not support alibi.");
  TORCH_CHECK_NOT_IMPLEMENTED(!(block_table.has_value() && block_table->defined()), op,
                              ": block_table (a paged key/value cache) is not supported on openreg");
  check_flash_inputs(op, query, key, value, cum_seq_q, cum_seq_k, /*backward=*/false);
  if (seqused_k.defined()) {
    TORCH_CHECK_NOT_IMPLEMENTED(cum_seq_q.defined(), op,
                                ": seqused_k without cum_seq_q/cum_seq_k (packed sequences) is not supported on "
                                "openreg");
    check_lengths(op, "seqused_k", seqused_k, cum_seq_q.numel() - 1, query);
  }
  check_dropout(op, dropout_p);
  TORCH_CHECK(!return_debug_mask || dropout_p > 0.0, "return_softmax is only supported when p_dropout > 0.0");
  TORCH_CHECK(!num_splits.has_value() || *num_splits <= 128, "num_splits > 128 not supported");

  const bool packed = cum_seq_q.defined();
  const Problem problem =
      flash_problem(query, key, value, cum_seq_q, cum_seq_k, seqused_k, is_causal, window_size_left,
                    window_size_right, scale);
  const Forward result = forward(problem, dropout_p);
  at::Tensor output = at::empty_like(query);
  output.copy_(heads_second(result.output, packed));
  // A query that attends to no key: +inf, as flash-attn writes it.
  at::Tensor logsumexp = result.logsumexp.masked_fill(result.logsumexp == -kInfinity, kInfinity);
  if (packed) {
    logsumexp = logsumexp.select(0, 0).contiguous(); // (heads, total_q)
  }
  at::Tensor rng_state = at::zeros({2}, at::dtype(at::kUInt64));
  if (dropout_p > 0.0) {
    auto* words = static_cast<uint64_t*>(rng_state.data_ptr());
    words[0] = result.seed;
    words[1] = result.offset;
  }
  at::Tensor debug_attn_mask = return_debug_mask
      ? flash_debug_mask(result, query, cum_seq_q, cum_seq_k, max_q.expect_int(), max_k.expect_int())
      : at::empty({0}, query.options());
  return {output, logsumexp, rng_state.to(query.device()), at::zeros({}, query.options().dtype(at::kUInt64)),
          debug_attn_mask};
}

// varlen_attn's out= form: the forward without dropout, its output written
// to `out` (as CUDA's mha_fwd takes `out_`), returning the logsumexp.
at::Tensor flash_attention_forward_no_dropout_inplace(
    at::Tensor& out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& cum_seq_q,
    const std::optional<at::Tensor>& cum_seq_k,
    c10::SymInt max_q,
    c10::SymInt max_k,
    double dropout_p,
    bool is_causal,
    bool return_debug_mask,
    std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left,
    std::optional<c10::SymInt> window_size_right,
    const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& block_table,
    std::optional<int64_t> num_splits) {
  TORCH_CHECK(dropout_p == 0.0, "_flash_attention_forward_no_dropout_inplace: dropout_p must be 0, got ", dropout_p);
  check_same_device("_flash_attention_forward_no_dropout_inplace", "out", out, query);
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "Output must have the same dtype as inputs");
  TORCH_CHECK(out.sizes() == query.sizes(), "out must have shape ", query.sizes(), " (the query's), got ",
              out.sizes());
  auto [output, logsumexp, rng_state, unused, debug_attn_mask] =
      flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, std::move(max_q), std::move(max_k), 0.0,
                              is_causal, return_debug_mask, scale, std::move(window_size_left),
                              std::move(window_size_right), seqused_k, alibi_slopes, block_table, num_splits);
  out.copy_(output);
  return logsumexp;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const at::Tensor& out,
    const at::Tensor& logsumexp,
    const at::Tensor& cum_seq_q,
    const at::Tensor& cum_seq_k,
    c10::SymInt max_q,
    c10::SymInt max_k,
    double dropout_p,
    bool is_causal,
    const at::Tensor& rng_state,
    const at::Tensor& unused,
    std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left,
    std::optional<c10::SymInt> window_size_right) {
  const char* op = kFlashBackward;
  check_flash_inputs(op, query, key, value, cum_seq_q, cum_seq_k, /*backward=*/true);
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "query and out must have the same dtype");
  TORCH_CHECK(grad_out.scalar_type() == query.scalar_type(), "query and dout must have the same dtype");
  TORCH_CHECK(out.sizes() == query.sizes(), "out must have shape ", query.sizes(), " (the query's), got ",
              out.sizes());
  TORCH_CHECK(grad_out.sizes() == query.sizes(), "dout must have shape ", query.sizes(), " (the query's), got ",
              grad_out.sizes());
  check_dropout(op, dropout_p);
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0.0) {
    // The forward's [seed, offset], read on the host (a wait for the device,
    // as CUDA's kernel reads it on the device instead).
    TORCH_CHECK(rng_state.numel() == 2 && rng_state.scalar_type() == at::kUInt64, op,
                ": rng_state must be the (2,) uint64 tensor _flash_attention_forward returned, got ",
                rng_state.scalar_type(), " of shape ", rng_state.sizes());
    const at::Tensor words = rng_state.cpu();
    seed = static_cast<const uint64_t*>(words.const_data_ptr())[0];
    offset = static_cast<const uint64_t*>(words.const_data_ptr())[1];
  }
  const bool packed = cum_seq_q.defined();
  const Problem problem = flash_problem(query, key, value, cum_seq_q, cum_seq_k, at::Tensor(), is_causal,
                                        window_size_left, window_size_right, scale);
  const MathAttentionGrads grads = backward(problem, heads_first(grad_out, packed), dropout_p, seed, offset);
  at::Tensor grad_query = at::empty_like(query);
  at::Tensor grad_key = at::empty_like(key);
  at::Tensor grad_value = at::empty_like(value);
  grad_query.copy_(heads_second(grads.query, packed));
  grad_key.copy_(heads_second(grads.key, packed));
  grad_value.copy_(heads_second(grads.value, packed));
  return {grad_query, grad_key, grad_value};
}

// ---- Memory-efficient attention ----

constexpr const char* kEfficientForward = "_efficient_attention_forward";
constexpr const char* kEfficientBackward = "_efficient_attention_backward";

enum CustomMaskType : int64_t { kNoCustomMask = 0, kCausalFromTopLeft = 1, kCausalFromBottomRight = 2 };

// As CUDA's attention.cu and kernel_forward.h check them.
void check_efficient_inputs(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                            int64_t custom_mask_type, std::optional<int64_t> window_size) {
  TORCH_CHECK(query.is_privateuseone(), op, ": query must be an openreg tensor, got one on ", query.device());
  check_same_device(op, "key", key, query);
  check_same_device(op, "value", value, query);
  for (const auto& [name, t] : {std::pair{"query", &query}, std::pair{"key", &key}, std::pair{"value", &value}}) {
    TORCH_CHECK(t->dim() == 4, op, ": ", name, " must be 4-D (batch, seqlen, num_heads, head_dim), got ", t->dim(),
                "-D");
    check_last_dim_contiguous(op, name, *t);
  }
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "Only fp32, half & bf16 supported at the moment");
  TORCH_CHECK(key.scalar_type() == dtype && value.scalar_type() == dtype, op,
              ": query, key and value must have the same dtype, got ", dtype, ", ", key.scalar_type(), " and ",
              value.scalar_type());
  TORCH_CHECK(key.size(0) == query.size(0) && value.size(0) == query.size(0), op,
              ": query, key and value must have the same batch size, got ", query.size(0), ", ", key.size(0),
              " and ", value.size(0));
  TORCH_CHECK(key.size(1) == value.size(1), op, ": key and value must have the same sequence length, got ",
              key.size(1), " and ", value.size(1));
  TORCH_CHECK(key.size(2) == value.size(2), op, ": key and value must have the same number of heads, got ",
              key.size(2), " and ", value.size(2));
  TORCH_CHECK(key.size(2) > 0 && query.size(2) % key.size(2) == 0,
              "Number of heads in key/value must divide number of heads in query");
  TORCH_CHECK(query.size(3) == key.size(3), op, ": query and key must have the same head_dim, got ", query.size(3),
              " and ", key.size(3));
  TORCH_CHECK(cu_seqlens_q.defined() == cu_seqlens_k.defined(), op,
              ": cu_seqlens_q and cu_seqlens_k must be both set or both not set");
  if (cu_seqlens_q.defined()) {
    check_offsets(op, "cu_seqlens_q", cu_seqlens_q, query);
    check_offsets(op, "cu_seqlens_k", cu_seqlens_k, query);
    TORCH_CHECK(cu_seqlens_q.numel() == cu_seqlens_k.numel(), op,
                ": cu_seqlens_q and cu_seqlens_k must have the same size, got ", cu_seqlens_q.numel(), " and ",
                cu_seqlens_k.numel());
    TORCH_CHECK(query.size(0) == 1, "cu_seqlen only supports batch_size=1");
  }
  TORCH_CHECK(custom_mask_type >= kNoCustomMask && custom_mask_type <= kCausalFromBottomRight,
              "invalid value for `custom_mask_type`");
  TORCH_CHECK(!window_size.has_value() || *window_size == 0 || custom_mask_type != kNoCustomMask,
              "LocalAttention only supported in causal mode");
}

Problem efficient_problem(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& bias, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                          const at::Tensor& seqlen_k, int64_t custom_mask_type, std::optional<int64_t> window_size,
                          std::optional<double> scale) {
  Problem problem{query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), {}, bias, scale};
  Band band;
  band.bottom_right = custom_mask_type == kCausalFromBottomRight;
  if (custom_mask_type != kNoCustomMask) {
    band.right = 0;
    if (window_size.has_value() && *window_size > 0) {
      band.left = *window_size - 1;
    }
  }
  if (cu_seqlens_q.defined()) {
    problem.keep = keep_mask(packed_tokens(cu_seqlens_q, query.size(1), at::Tensor()),
                             packed_tokens(cu_seqlens_k, key.size(1), seqlen_k), band);
  } else if (band.bounded()) {
    const auto long_options = query.options().dtype(at::kLong);
    problem.keep =
        keep_mask(dense_tokens(query.size(1), long_options), dense_tokens(key.size(1), long_options), band);
  }
  return problem;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt> efficient_attention_forward(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& bias_opt,
    const std::optional<at::Tensor>& cu_seqlens_q_opt,
    const std::optional<at::Tensor>& cu_seqlens_k_opt,
    std::optional<c10::SymInt> max_seqlen_q,
    std::optional<c10::SymInt> max_seqlen_k,
    double dropout_p,
    int64_t custom_mask_type,
    bool compute_log_sumexp,
    std::optional<double> scale,
    const std::optional<at::Tensor>& seqlen_k_opt,
    std::optional<int64_t> window_size) {
  const char* op = kEfficientForward;
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const at::Tensor cu_seqlens_q = cu_seqlens_q_opt.value_or(at::Tensor());
  const at::Tensor cu_seqlens_k = cu_seqlens_k_opt.value_or(at::Tensor());
  const at::Tensor seqlen_k = seqlen_k_opt.value_or(at::Tensor());
  check_efficient_inputs(op, query, key, value, cu_seqlens_q, cu_seqlens_k, custom_mask_type, window_size);
  check_dropout(op, dropout_p);
  const bool packed = cu_seqlens_q.defined();
  const int64_t batch = query.size(0), seqlen_q = query.size(1), seqlen_kv = key.size(1);
  const int64_t heads = query.size(2);
  if (packed) {
    TORCH_CHECK(max_seqlen_q.has_value(), op, ": max_seqlen_q is required with cu_seqlens_q");
    TORCH_CHECK(max_seqlen_k.has_value(), op, ": max_seqlen_k is required with cu_seqlens_k");
    TORCH_CHECK_NOT_IMPLEMENTED(!bias.defined(), op,
                                ": bias with cu_seqlens_q (packed sequences) is not supported on openreg (CUDA's "
                                "backward refuses it: cu seqlen + bias not supported)");
  }
  if (bias.defined()) {
    check_same_device(op, "bias", bias, query);
    TORCH_CHECK(bias.scalar_type() == query.scalar_type(), "invalid dtype for bias - should match query's dtype");
    TORCH_CHECK(bias.dim() == 4, "Bias expected in BMHK format");
    TORCH_CHECK(bias.size(0) == batch, "attn_bias: wrong shape (batch dimension)");
    TORCH_CHECK(bias.size(1) == heads, "attn_bias: wrong shape (head dimension)");
    TORCH_CHECK(bias.size(2) == seqlen_q, "attn_bias: wrong shape (seqlenQ dimension)");
    TORCH_CHECK(bias.size(3) == seqlen_kv, "attn_bias: wrong shape (seqlenKV dimension)");
    TORCH_CHECK(bias.numel() == 0 || bias.stride(3) == 1,
                "attn_bias: wrong alignment (last dimension must be contiguous)");
  }
  // CUDA's dense kernel reads seqlen_k only for packed sequences.
  const at::Tensor used_keys = packed ? seqlen_k : at::Tensor();
  if (used_keys.defined()) {
    check_lengths(op, "seqlen_k", used_keys, cu_seqlens_q.numel() - 1, query);
  }

  const Problem problem = efficient_problem(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, used_keys,
                                            custom_mask_type, window_size, scale);
  const Forward result = forward(problem, dropout_p);
  at::Tensor output = at::empty({batch, seqlen_q, heads, value.size(3)}, query.options());
  output.copy_(result.output.transpose(1, 2));

  const int64_t query_rows = packed ? max_seqlen_q->expect_int() : seqlen_q;
  const int64_t lse_batch = packed ? cu_seqlens_q.numel() - 1 : batch;
  const int64_t lse_width = compute_log_sumexp ? round_up(query_rows, 32) : 0;
  at::Tensor logsumexp;
  if (lse_width == 0 || lse_batch == 0 || heads == 0) {
    logsumexp = at::full({lse_batch, heads, lse_width}, kInfinity, query.options().dtype(at::kFloat));
  } else {
    // A query that attends to no key: 0, as the kernel writes it; the
    // padding: +inf.
    const at::Tensor rows = result.logsumexp.masked_fill(result.logsumexp == -kInfinity, 0);
    if (!packed) {
      logsumexp = at::constant_pad_nd(rows, {0, lse_width - seqlen_q}, kInfinity);
    } else if (seqlen_q == 0) {
      logsumexp = at::full({lse_batch, heads, lse_width}, kInfinity, query.options().dtype(at::kFloat));
    } else {
      const SequenceSlots slots =
          sequence_slots(packed_tokens(cu_seqlens_q, seqlen_q, at::Tensor()), lse_width, seqlen_q);
      logsumexp = rows.select(0, 0)
                      .index_select(1, slots.index.flatten())
                      .view({heads, lse_batch, lse_width})
                      .permute({1, 0, 2})
                      .masked_fill(slots.valid.logical_not().unsqueeze(1), kInfinity)
                      .contiguous();
    }
  }
  // philox_seed and philox_offset stay on the host, as CUDA's outside graph capture.
  const auto host_long = at::dtype(at::kLong);
  at::Tensor philox_seed = at::scalar_tensor(static_cast<int64_t>(result.seed), host_long);
  at::Tensor philox_offset = at::scalar_tensor(static_cast<int64_t>(result.offset), host_long);
  return {output,
          logsumexp,
          philox_seed,
          philox_offset,
          c10::SymInt(query_rows),
          max_seqlen_k.has_value() ? *max_seqlen_k : c10::SymInt(seqlen_kv)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_backward(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& bias_opt,
    const at::Tensor& out,
    const std::optional<at::Tensor>& cu_seqlens_q_opt,
    const std::optional<at::Tensor>& cu_seqlens_k_opt,
    c10::SymInt max_seqlen_q,
    c10::SymInt max_seqlen_k,
    const at::Tensor& logsumexp,
    double dropout_p,
    const at::Tensor& philox_seed,
    const at::Tensor& philox_offset,
    int64_t custom_mask_type,
    bool bias_requires_grad,
    std::optional<double> scale,
    std::optional<int64_t> num_splits_key,
    std::optional<int64_t> window_size,
    bool shared_storage_dqdkdv) {
  const char* op = kEfficientBackward;
  if (!grad_out.defined()) {
    return {}; // nothing flows back
  }
  // Autograd saves an absent optional as an undefined tensor.
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const at::Tensor cu_seqlens_q = cu_seqlens_q_opt.value_or(at::Tensor());
  const at::Tensor cu_seqlens_k = cu_seqlens_k_opt.value_or(at::Tensor());
  check_efficient_inputs(op, query, key, value, cu_seqlens_q, cu_seqlens_k, custom_mask_type, window_size);
  check_dropout(op, dropout_p);
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(0) == query.size(0) && grad_out.size(1) == query.size(1) &&
                  grad_out.size(2) == query.size(2) && grad_out.size(3) == value.size(3),
              op, ": grad_out must have the output's shape (", query.size(0), ", ", query.size(1), ", ",
              query.size(2), ", ", value.size(3), "), got ", grad_out.sizes());
  const bool packed = cu_seqlens_q.defined();
  TORCH_CHECK(!(packed && bias.defined()), "cu seqlen + bias not supported");
  if (packed) {
    const int64_t max_q = max_seqlen_q.expect_int(), max_k = max_seqlen_k.expect_int();
    TORCH_CHECK(max_q > 0, "max_seqlen_q required with `cu_seqlens_q`");
    TORCH_CHECK(max_k > 0, "max_seqlen_k required with `cu_seqlens_k`");
    TORCH_CHECK(max_k <= key.size(1), "Invalid max_seqlen_k:", max_k);
    TORCH_CHECK(max_q <= query.size(1), "Invalid max_seqlen_q:", max_q);
  }
  TORCH_CHECK(!bias_requires_grad || bias.defined(), "bias_requires_grad is true but no bias was provided");
  const int64_t batch = query.size(0), seqlen_q = query.size(1), heads = query.size(2), head_dim = query.size(3);
  if (shared_storage_dqdkdv) {
    TORCH_CHECK(key.size(2) == heads, "`shared_storage_dqdkdv` does not support grouped query attention");
    TORCH_CHECK(seqlen_q == key.size(1),
                "`shared_storage_dqdkdv` is only supported when Q/K/V have the same sequence length: got ",
                seqlen_q, " query tokens and ", key.size(1), " key/value tokens");
    TORCH_CHECK(head_dim == key.size(3) && head_dim == value.size(3),
                "`shared_storage_dqdkdv` is only supported when Q/K/V have the same embed dim: got ", head_dim,
                " for Q, ", key.size(3), " for K, and ", value.size(3), " for V");
  }
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0.0) {
    // The forward's host scalars (an openreg tensor is read back, a wait).
    seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
    offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  }

  const Problem problem = efficient_problem(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, at::Tensor(),
                                            custom_mask_type, window_size, scale);
  const MathAttentionGrads grads = backward(problem, grad_out.transpose(1, 2), dropout_p, seed, offset);
  at::Tensor grad_query, grad_key, grad_value;
  if (shared_storage_dqdkdv) {
    // One chunk, as CUDA allocates it: q, k and v usually come chunked from
    // one linear layer, whose gradient is then this chunk.
    at::Tensor chunk = at::empty({batch, seqlen_q, 3, heads, head_dim}, query.options());
    grad_query = chunk.select(2, 0);
    grad_key = chunk.select(2, 1);
    grad_value = chunk.select(2, 2);
  } else {
    grad_query = at::empty(query.sizes(), query.options());
    grad_key = at::empty(key.sizes(), key.options());
    grad_value = at::empty(value.sizes(), value.options());
  }
  grad_query.copy_(grads.query.transpose(1, 2));
  grad_key.copy_(grads.key.transpose(1, 2));
  grad_value.copy_(grads.value.transpose(1, 2));
  at::Tensor grad_bias;
  if (bias_requires_grad) {
    // The last dimension padded to a multiple of 16, as CUDA aligns it.
    std::vector<int64_t> padded = bias.sizes().vec();
    const int64_t last = padded.back();
    padded.back() = round_up(last, 16);
    grad_bias = at::empty(padded, bias.options()).slice(-1, 0, last);
    grad_bias.copy_(grads.scores.sum_to_size(bias.sizes()));
  }
  return {grad_query, grad_key, grad_value, grad_bias};
}

} // namespace

void register_flash_efficient_attention(KernelRegistrar& kernels) {
  kernels.impl("_flash_attention_forward", TORCH_FN(flash_attention_forward));
  kernels.impl("_flash_attention_forward_no_dropout_inplace", TORCH_FN(flash_attention_forward_no_dropout_inplace));
  kernels.impl("_flash_attention_backward", TORCH_FN(flash_attention_backward));
  kernels.impl("_efficient_attention_forward", TORCH_FN(efficient_attention_forward));
  kernels.impl("_efficient_attention_backward", TORCH_FN(efficient_attention_backward));
}

} // namespace openreg
