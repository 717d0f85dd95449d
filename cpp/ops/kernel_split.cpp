#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/ops/kernel_split.h"

#include <algorithm>
#include <bit>
#include <exception>
#include <vector>

#include <ATen/ExpandUtils.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

extern "C" void orRunKernelChunks(size_t chunks, void (*body)(void*, size_t), void* context);

namespace openreg {
namespace {

struct Chunks {
  const std::function<void(size_t)>& body;
  std::vector<std::exception_ptr> failures; // one slot per chunk
};

// Called by the pool from any of its threads; never throws (the pool is Rust).
void run_one_chunk(void* context, size_t chunk) noexcept {
  auto* chunks = static_cast<Chunks*>(context);
  try {
    KernelScope scope;
    chunks->body(chunk);
  } catch (...) {
    chunks->failures[chunk] = std::current_exception();
  }
}

} // namespace

// Note [Chunk size]: a kernel of under 8 splits' work runs as 2 chunks,
// and a larger one in a power of two of chunks of 4 to 8 splits' work
// each, instead of one chunk per split. Chunks of one split ran slower per
// element than larger ones: CPU's add, single-threaded on views of 2M
// floats, took 222-225 us a call in 1, 2 or 4 calls (of 500K floats or
// more) and 269-291 us in 10 or 12 calls (200K or 167K), though the same
// chunked loop in plain C did not slow down (210-221 us for 1 to 100
// calls); an add of 4M floats on openreg, split in 30 chunks, ran at
// 288-314 us a call where CPU PyTorch's ran at 218-260, and at 230-267 us
// in 4 chunks, 232-249 in 8 (in the rounds where this machine's memory
// was fast, of 10 rounds of fresh processes); with this rule (4 chunks)
// at 226-244 us where the previous one's ran at 280-317. A power of two
// keeps the chunks evenly shared by 2, 4 or 8 threads; a machine of more
// cores than chunks leaves some idle for kernels of under 8 splits' work
// per core.
constexpr int64_t kSplitsPerLargeChunk = 4;

int64_t split_elements() {
  static const int64_t elements = static_cast<int64_t>(ffi::split_elements());
  return elements;
}

int64_t chunks_for_work(int64_t work) {
  const int64_t split = split_elements();
  if (work < split) {
    return 1;
  }
  // Note [Chunk size]
  const auto large_chunks = static_cast<uint64_t>(work / (kSplitsPerLargeChunk * split));
  return std::max<int64_t>(2, static_cast<int64_t>(std::bit_floor(large_chunks)));
}

void run_chunks(size_t chunks, const std::function<void(size_t)>& body) {
  if (chunks == 1) {
    body(0);
    return;
  }
  Chunks context{body, std::vector<std::exception_ptr>(chunks)};
  orRunKernelChunks(chunks, &run_one_chunk, &context);
  for (const std::exception_ptr& failure : context.failures) {
    if (failure) {
      std::rethrow_exception(failure);
    }
  }
}

RowRanges::RowRanges(int64_t rows, int64_t work, int64_t min_rows) : rows_(rows) {
  count_ = std::max<int64_t>(1, std::min(rows / std::max<int64_t>(min_rows, 1), chunks_for_work(work)));
}

at::Tensor RowRanges::narrow(const at::Tensor& t, int64_t dim, size_t i) const {
  const int64_t begin = this->begin(i);
  const int64_t end = this->end(i);
  if (!t.is_cpu() || t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() || t.is_mkldnn()) {
    return t.narrow(dim, begin, end - begin);
  }
  // A chunk's view, made directly: Tensor::narrow is an op (a dispatch per
  // tensor per chunk, which a small chunk notices).
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  c10::DimVector sizes(t.sizes().begin(), t.sizes().end());
  sizes[dim] = end - begin;
  impl->set_sizes_and_strides(sizes, t.strides(), t.storage_offset() + begin * t.stride(dim));
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(std::move(impl));
}

PointwiseSplit::PointwiseSplit(c10::IntArrayRef shape, int64_t work) : result_dims_(static_cast<int64_t>(shape.size())) {
  if (chunks_for_work(work) < 2) {
    return;
  }
  for (int64_t d = 0; d < result_dims_; ++d) {
    if (shape[d] > 1) {
      dim_ = d;
      ranges_ = RowRanges(shape[d], work);
      return;
    }
  }
}

int64_t PointwiseSplit::dim_of(const at::Tensor& t) const {
  const int64_t aligned = dim_ - (result_dims_ - t.dim());
  return aligned >= 0 && t.size(aligned) == ranges_.rows() ? aligned : -1;
}

at::Tensor PointwiseSplit::part(const at::Tensor& t, size_t i) const {
  if (!split() || !t.defined()) {
    return t;
  }
  const int64_t dim = dim_of(t);
  return dim < 0 ? t : ranges_.narrow(t, dim, i); // whole: broadcast along the split dimension
}

namespace {

// A matrix product's multiply-adds count as 1/8 element of pointwise work
// (single-threaded, 64x256 by 256x256 took 105 us, an add of 200K
// elements 32 us); a softmax's or a norm's elements as 4 (measured against
// an add's); a convolution's: see batch_ranges in convolution.cpp.
constexpr int64_t kMultiplyAddsPerElement = 8;
constexpr int64_t kNormWorkPerElement = 4;
// A 2-D pooling's input elements: 2x2 max pooling of 200K elements took as
// long as an add of 2.6M (single-threaded, with its indices).
constexpr int64_t kPoolWorkPerElement = 8;
// The most work any rule below counts per element of its largest operand.
constexpr int64_t kHeaviestWorkPerElement = std::max(kNormWorkPerElement, kPoolWorkPerElement);
// Note [Matrix chunks]: a matrix product is cut along the longer of the
// result's dimensions, rows or columns: each chunk then reads the whole of
// the smaller matrix and its share of the larger (a chunk of rows takes the
// whole right matrix, a chunk of columns the whole left one), so less data
// crosses to the helper's core. The MLP step's 64x256 by 256x256 products
// read all 256 KB of weights per row chunk and half of them per column
// chunk: the step took 0.964-0.974x the time cut by columns (medians of 3
// processes alternating batches of 50 steps between the two cuts). Below,
// "rows" are the rows or the columns cut.
//
// Each chunk of a matrix product packs the whole right matrix again, and
// a product of few rows runs slower per row (single-threaded, K = N = 256:
// 32 rows cost 1.15x a row of 1024, 16 rows 1.35x, 8 rows 1.75x). So a
// chunk has at least half the rows when they are fewer than 512, and at
// least 256 above (1024x1024 on 2 cores: 16-row chunks ran 1.5-3x slower
// than 256-row ones, which match MKL's own two threads), and never fewer
// than 32.
constexpr int64_t kMatrixRowsPerChunk = 256;
constexpr int64_t kFewestMatrixRowsPerChunk = 32;

int64_t matrix_rows_per_chunk(int64_t rows) {
  return std::clamp<int64_t>(rows / 2, kFewestMatrixRowsPerChunk, kMatrixRowsPerChunk);
}

bool has_generator(const c10::FunctionSchema& schema) {
  for (const c10::Argument& argument : schema.arguments()) {
    c10::TypePtr type = argument.type();
    if (type->kind() == c10::TypeKind::OptionalType) {
      type = type->castRaw<c10::OptionalType>()->getElementType();
    }
    if (type->kind() == c10::TypeKind::GeneratorType) {
      return true;
    }
  }
  return false;
}

// Per tensor of `arguments` (for_each_tensor order): whether the op writes it.
std::vector<bool> written_tensors(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  std::vector<bool> written;
  const auto& schema_arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = i < schema_arguments.size() ? schema_arguments[i].alias_info() : nullptr;
    for_each_tensor(arguments[i], [&](const at::Tensor&) { written.push_back(alias != nullptr && alias->isWrite()); });
  }
  return written;
}

// `shape` broadcast with `sizes`, in place; false if they do not broadcast.
bool broadcast_into(c10::DimVector& shape, c10::IntArrayRef sizes) {
  if (sizes.size() > shape.size()) {
    shape.insert(shape.begin(), sizes.size() - shape.size(), 1);
  }
  const size_t offset = shape.size() - sizes.size();
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t& s = shape[offset + d];
    if (s == 1) {
      s = sizes[d];
    } else if (sizes[d] != 1 && sizes[d] != s) {
      return false;
    }
  }
  return true;
}

// Whether a tensor the call writes shares memory with another of its
// tensors.
bool written_tensor_shares_memory(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  const std::vector<bool> written = written_tensors(op, arguments);
  std::vector<const void*> all;
  std::vector<const void*> writes;
  for (const c10::IValue& value : arguments) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      const void* storage = t.storage().unsafeGetStorageImpl();
      if (written[all.size()]) {
        writes.push_back(storage);
      }
      all.push_back(storage);
    });
  }
  std::sort(all.begin(), all.end());
  return std::any_of(writes.begin(), writes.end(), [&](const void* storage) {
    const auto [first, last] = std::equal_range(all.begin(), all.end(), storage);
    return last - first > 1;
  });
}

// Elements [begin, end) of a list.
c10::IValue list_part(const c10::IValue& list, int64_t begin, int64_t end) {
  const c10::impl::GenericList whole = list.toList();
  c10::impl::GenericList part(whole.elementType());
  part.reserve(end - begin);
  for (int64_t j = begin; j < end; ++j) {
    part.push_back(whole.get(j));
  }
  return c10::IValue(std::move(part));
}

// A dimension argument `dim` of a tensor of `dims` dimensions, made
// non-negative (as maybe_wrap_dim; 0-dim tensors have one dimension to name).
int64_t wrapped(int64_t dim, int64_t dims) {
  return dim < 0 ? dim + std::max<int64_t>(dims, 1) : dim;
}

} // namespace

CallSplit::CallSplit(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, int64_t largest_operand) {
  const std::string& name = op.operator_name().name;
  if (name.rfind("aten::_foreach_", 0) == 0) {
    split_lists(op, arguments);
    return;
  }
  // The common case, decided cheaply (every fallback call asks): a call
  // none of whose operands reaches split_elements() even at the heaviest
  // weight per element is not split. Comparing bare elements instead left a
  // 2x2 max pooling of 100K elements (800K of work) whole: 3-5x CPU's time.
  // A matrix product of largest operand L has at most L^1.5 multiply-adds,
  // so some products below this bound reach it and stay whole (up to 258K
  // of work, 127x128 by 128x127, at the default); the decision still
  // depends on shapes alone.
  if (largest_operand * kHeaviestWorkPerElement < split_elements()) {
    return;
  }
  const std::vector<at::Tensor> tensors = tensors_of(arguments);
  if (tensors.empty()) {
    return;
  }
  const at::Tensor& first = tensors[0];
  // Every tensor narrowed along dimension 0 (batched and row-wise rules).
  const auto all_rows = [&](int64_t work) {
    ranges_ = RowRanges(first.size(0), work);
    argument_dims_.assign(tensors.size(), 0);
  };
  if (op.hasTag(at::Tag::pointwise)) {
    if (op.hasTag(at::Tag::nondeterministic_seeded) || has_generator(op.schema())) {
      return;
    }
    // The result's shape: the inputs' broadcast. A written argument (out=,
    // in-place) must have it already (an out= the op resizes is not split).
    const std::vector<bool> written = written_tensors(op, arguments);
    c10::DimVector shape;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (!written[k] && !broadcast_into(shape, tensors[k].sizes())) {
        return;
      }
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (written[k] && tensors[k].sizes() != c10::IntArrayRef(shape)) {
        return;
      }
    }
    const PointwiseSplit pointwise(shape);
    if (!pointwise.split()) {
      return;
    }
    result_dim_ = pointwise.dim();
    ranges_ = pointwise.ranges();
    for (const at::Tensor& t : tensors) {
      argument_dims_.push_back(pointwise.dim_of(t));
    }
  } else if (name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm" || name == "aten::baddbmm") {
    // mm(self, mat2[, out]), addmm(self (the bias), mat1, mat2, ...[, out]),
    // and their batched forms: result rows, or the batch.
    const bool batched = name == "aten::bmm" || name == "aten::baddbmm";
    const bool bias = name == "aten::addmm" || name == "aten::baddbmm";
    const int64_t dims = batched ? 3 : 2;
    if (tensors.size() < (bias ? 3u : 2u)) {
      return;
    }
    const at::Tensor& left = tensors[bias ? 1 : 0];
    const at::Tensor& right = tensors[bias ? 2 : 1];
    if (left.dim() != dims || right.dim() != dims) {
      return;
    }
    const int64_t rows = left.size(0);
    const int64_t columns = right.size(dims - 1);
    const int64_t work = left.numel() * columns / kMultiplyAddsPerElement;
    if (batched) {
      ranges_ = RowRanges(rows, work);
      argument_dims_.assign(tensors.size(), 0); // out= has the result's batch
      if (bias && !(first.dim() == dims && first.size(0) == rows)) {
        argument_dims_[0] = -1; // a bias broadcast along the batch
      }
    } else {
      // Each chunk takes the whole of one matrix (Note [Matrix chunks]).
      const bool by_columns = rows < columns;
      const int64_t cut = by_columns ? columns : rows;
      result_dim_ = by_columns ? 1 : 0;
      ranges_ = RowRanges(cut, work, matrix_rows_per_chunk(cut));
      argument_dims_.assign(tensors.size(), result_dim_); // out= is cut as the result
      argument_dims_[bias ? 1 : 0] = by_columns ? -1 : 0;
      argument_dims_[bias ? 2 : 1] = by_columns ? 1 : -1;
      if (bias) {
        // The bias broadcasts to the result: cut where it spans the result's
        // split dimension (its last dimension matches the result's last).
        const int64_t along = first.dim() - (2 - result_dim_);
        const bool spans = along >= 0 && first.size(along) == ranges_.rows();
        argument_dims_[0] = spans ? along : -1;
      }
    }
  } else if (name == "aten::_softmax" || name == "aten::_log_softmax" || name == "aten::_softmax_backward_data" ||
             name == "aten::_log_softmax_backward_data") {
    // (self or grad_output, [output,] dim, ...): split when dim is not 0.
    const size_t dim_at = name.find("backward") == std::string::npos ? 1 : 2;
    if (first.dim() >= 2 && arguments.size() > dim_at && arguments[dim_at].isInt() &&
        wrapped(arguments[dim_at].toInt(), first.dim()) != 0) {
      all_rows(first.numel() * kNormWorkPerElement);
    }
  } else if (name == "aten::sum" || name == "aten::mean" || name == "aten::amax" || name == "aten::amin") {
    // (self, dim[], keepdim, ...): split when the dimensions reduced leave 0.
    if (first.dim() < 2 || arguments.size() < 2 || !arguments[1].isIntList()) {
      return;
    }
    const auto dims = arguments[1].toIntList();
    const bool reduces_rows = dims.empty() || std::any_of(dims.begin(), dims.end(), [&](int64_t d) {
      return wrapped(d, first.dim()) == 0;
    });
    if (!reduces_rows) {
      all_rows(first.numel());
    }
  } else if (name == "aten::max_pool2d" || name == "aten::max_pool2d_with_indices" ||
             name == "aten::max_pool2d_with_indices_backward" || name == "aten::avg_pool2d") {
    // Pooling is independent per image and channel: the leading dimension of
    // a batched (4-D) or unbatched (3-D) input, every tensor alike (the
    // backward's grad_output, input and indices).
    if (first.dim() >= 3) {
      all_rows(std::max(first.numel(), tensors.back().numel()) * kPoolWorkPerElement);
    }
  } else if (name == "aten::native_layer_norm") {
    // (input, normalized_shape, weight?, bias?, eps): rows of the input.
    if (arguments.size() >= 2 && arguments[1].isIntList() &&
        first.dim() > static_cast<int64_t>(arguments[1].toIntList().size())) {
      all_rows(first.numel() * kNormWorkPerElement);
      std::fill(argument_dims_.begin() + 1, argument_dims_.end(), -1); // weight and bias
    }
  }
}

// Note [List chunks]: an in-place foreach op (Note [Foreach ops] in
// fallback.cpp) is cut between the tensors of its lists: chunk i takes the
// same range of tensors from every list argument (tensors and scalars
// alike), the ranges holding about equal numbers of elements (counted on
// the first tensor list, as many chunks as a pointwise op of that many
// elements), each tensor whole. So each tensor is computed by the same
// per-tensor CPU kernel whatever the chunks. The chunks run at once, and
// the op's loop in list order: a call whose written tensors share memory
// with any other of its tensors (a list naming a tensor twice, views of one
// storage) is not cut, nor is a call with a list of another length (not
// one entry per tensor), or with results.
void CallSplit::split_lists(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  const auto first = std::find_if(arguments.begin(), arguments.end(), [](const c10::IValue& v) {
    return v.isTensorList();
  });
  if (first == arguments.end() || !op.schema().returns().empty()) {
    return;
  }
  const c10::List<at::Tensor> tensors = first->toTensorList();
  const int64_t length = static_cast<int64_t>(tensors.size());
  std::vector<int64_t> ends; // elements of the tensors up to each one, inclusive
  int64_t total = 0;
  for (const at::Tensor& t : tensors) {
    total += t.numel();
    ends.push_back(total);
  }
  const int64_t count = std::min(length, chunks_for_work(total));
  if (count < 2) {
    return;
  }
  for (const c10::IValue& value : arguments) {
    if (value.isList() && static_cast<int64_t>(value.toListRef().size()) != length) {
      return;
    }
  }
  if (written_tensor_shares_memory(op, arguments)) {
    return;
  }
  list_bounds_.push_back(0);
  int64_t last = 0; // the last tensor of the chunk so far
  for (int64_t k = 1; k < count; ++k) {
    const int64_t target = static_cast<int64_t>(static_cast<__int128>(total) * k / count);
    while (ends[last] < target) {
      ++last;
    }
    if (last + 1 > list_bounds_.back() && last + 1 < length) {
      list_bounds_.push_back(last + 1);
    }
  }
  list_bounds_.push_back(length);
  if (list_bounds_.size() < 3) {
    list_bounds_.clear();
  }
}

bool CallSplit::fits_results(const torch::jit::Stack& results) const {
  if (!list_bounds_.empty()) {
    return results.empty();
  }
  bool fits = split();
  for (const c10::IValue& value : results) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      fits = fits && t.dim() > result_dim_ && t.size(result_dim_) == ranges_.rows();
    });
  }
  return fits;
}

torch::jit::Stack CallSplit::arguments_part(const torch::jit::Stack& arguments, size_t i) const {
  torch::jit::Stack part = arguments;
  if (!list_bounds_.empty()) {
    for (c10::IValue& value : part) {
      if (value.isList()) {
        value = list_part(value, list_bounds_[i], list_bounds_[i + 1]);
      }
    }
    return part;
  }
  size_t k = 0;
  for (c10::IValue& value : part) {
    map_tensors(value, [&](const at::Tensor& t) {
      const int64_t dim = argument_dims_.at(k++);
      return dim < 0 ? t : ranges_.narrow(t, dim, i);
    });
  }
  return part;
}

torch::jit::Stack CallSplit::results_part(const torch::jit::Stack& results, size_t i) const {
  torch::jit::Stack part = results;
  for (c10::IValue& value : part) {
    map_tensors(value, [&](const at::Tensor& t) { return ranges_.narrow(t, result_dim_, i); });
  }
  return part;
}

} // namespace openreg
