// Note [Split kernels]: a large device kernel uses every core, and its
// results never depend on how many.
//
// A kernel whose work is at least OPENREG_SPLIT_ELEMENTS runs as chunks
// (two, or more of 4 to 8 times that work each: Note [Chunk size] in
// kernel_split.cpp):
// each chunk is the same single-threaded CPU kernel on views of the
// device memory that select a range of rows of its results (and the
// arguments' rows that produce them). The ranges depend only on the shapes
// and that option, so every run computes each element with the same
// instructions, whatever the thread count and whether the kernel ran inline
// or queued. The chunks run on the kernel pool (Note [Kernel pool] in
// src/runtime/kernel_pool.rs), inside the one stream task that launched them.
//
// What is split, and along which dimension:
//  - pointwise ops (torch.Tag.pointwise), copies and fills: the outermost
//    dimension of the result larger than 1; an argument is narrowed where it
//    spans that dimension and left whole where it broadcasts along it;
//  - matrix products (mm, addmm, bmm, baddbmm): result rows, or columns when
//    they are more (Note [Matrix chunks] in kernel_split.cpp), or the batch
//    of a batched product, the arguments that produce them narrowed alike;
//  - softmax-like ops, reductions over inner dimensions and layer norm:
//    dimension 0 when it is not reduced;
//  - convolution: the batch (its backward too: grad_input by batch, and the
//    weight and bias gradients, sums over the batch, as one share per range
//    of the batch, added in range order); 2-D pooling: the batch (or the
//    channels of an unbatched input); 2-D max pooling of float/double, by
//    openreg's own loop: planes (cpp/ops/max_pool.cpp);
//  - batch norm in training, forward and backward, by openreg's own loops:
//    the channels (cpp/ops/batch_norm.cpp);
//  - in-place foreach ops (Note [Foreach ops] in fallback.cpp): whole tensors
//    of their lists (Note [List chunks] in kernel_split.cpp).
// Ops drawing random numbers are never split (their draws are laid out for
// the whole tensor).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>

namespace openreg {

// OPENREG_SPLIT_ELEMENTS: the work, in elements, from which a kernel splits.
int64_t split_elements();

// The chunks a kernel of `work` elements of work is cut into, when its
// shape allows (see the Note): 1 below split_elements(), then a power of
// two, at least 2 (Note [Chunk size] in kernel_split.cpp).
int64_t chunks_for_work(int64_t work);

// Runs `body(i)` for every chunk i < `chunks` on the kernel pool and returns
// when all have finished; each chunk runs under KernelScope (Note [Kernel
// threads] in device_memory.h). If chunks throw, the lowest chunk's
// exception is rethrown, after all have finished.
void run_chunks(size_t chunks, const std::function<void(size_t)>& body);

// `rows` rows cut into nearly equal ranges, as many as chunks_for_work(work)
// or fewer, each at least `min_rows`.
class RowRanges {
 public:
  RowRanges() = default; // one range: nothing is split
  RowRanges(int64_t rows, int64_t work, int64_t min_rows = 1);

  size_t count() const {
    return static_cast<size_t>(count_);
  }
  bool split() const {
    return count_ > 1;
  }
  int64_t rows() const {
    return rows_;
  }
  // Range i: rows [begin(i), end(i)).
  int64_t begin(size_t i) const {
    return static_cast<int64_t>(i) * rows_ / count_;
  }
  int64_t end(size_t i) const {
    return begin(i + 1);
  }
  // Range i of `t`'s dimension `dim` (which has rows() rows).
  at::Tensor narrow(const at::Tensor& t, int64_t dim, size_t i) const;

 private:
  int64_t rows_ = 0;
  int64_t count_ = 1;
};

// How a kernel over results of `shape` is split: along `dim`, the
// outermost dimension larger than 1 (pointwise kernels, copies, fills).
class PointwiseSplit {
 public:
  PointwiseSplit() = default; // not split
  PointwiseSplit(c10::IntArrayRef shape, int64_t work);
  explicit PointwiseSplit(c10::IntArrayRef shape) : PointwiseSplit(shape, c10::multiply_integers(shape)) {}

  size_t chunks() const {
    return ranges_.count();
  }
  bool split() const {
    return ranges_.split();
  }
  // The split dimension of the result, and its ranges.
  int64_t dim() const {
    return dim_;
  }
  const RowRanges& ranges() const {
    return ranges_;
  }
  // The dimension of `t` that lines up with the split one (as broadcasting
  // lines dimensions up, from the last) when `t` spans it; -1 when `t`
  // broadcasts along it.
  int64_t dim_of(const at::Tensor& t) const;
  // Chunk i of `t`: narrowed along dim_of(t), or whole.
  at::Tensor part(const at::Tensor& t, size_t i) const;

 private:
  int64_t dim_ = 0;
  int64_t result_dims_ = 0;
  RowRanges ranges_;
};

// How one call of a fallback op splits (the rules of the Note, by op):
// which dimension of each tensor of its arguments and of its results a
// chunk narrows; a call none of whose operands has a chunk's elements is
// not split. Made from the arguments alone, so the fallback knows
// before planning whether a call splits (a split call never takes the
// inline route, whose kernel is another: Note [Fallback] in fallback.cpp).
class CallSplit {
 public:
  CallSplit() = default; // not split
  // `largest_operand`: the most elements of any tensor argument.
  CallSplit(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, int64_t largest_operand);

  size_t chunks() const {
    return list_bounds_.empty() ? ranges_.count() : list_bounds_.size() - 1;
  }
  bool split() const {
    return chunks() > 1;
  }
  // Whether the planned (or computed) results are what the rule splits:
  // every result tensor has the split rows along the results' dimension.
  bool fits_results(const torch::jit::Stack& results) const;
  // Chunk i of the arguments (CPU views), tensors narrowed by the rule.
  torch::jit::Stack arguments_part(const torch::jit::Stack& arguments, size_t i) const;
  // Chunk i of the results (which fit_results).
  torch::jit::Stack results_part(const torch::jit::Stack& results, size_t i) const;

 private:
  // The rule of a foreach op (Note [List chunks] in kernel_split.cpp).
  void split_lists(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments);

  // A foreach op's chunk i: the tensors [list_bounds_[i], list_bounds_[i + 1])
  // of every list argument; empty for the other rules.
  std::vector<int64_t> list_bounds_;
  RowRanges ranges_;
  std::vector<int64_t> argument_dims_; // per argument tensor (for_each_tensor order); -1: whole
  int64_t result_dim_ = 0;
};

} // namespace openreg
