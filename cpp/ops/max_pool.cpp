// 2-D max pooling with indices, computed by openreg's own loop and split by
// planes (images times channels: Note [Split kernels] in kernel_split.h).
//
// CPU's kernel keeps the window's maximum and its index with a branch per
// element, which random data mispredicts half the time: single-threaded,
// 2x2 pooling of 200K floats took 1.27 ms, 40 times an add. This loop is
// CPU's, element for element (the same window bounds, the same order, the
// same rule: an element takes the maximum when it is greater, or NaN), with
// the maximum and its index chosen by a mask instead of a branch: 0.7 ms.
// (The loop's dependency chain per element is what is left; a standalone
// build of it ran in 0.2 ms, so there is more to find here.) Maxima are exact,
// so the results equal CPU's bit for bit, whatever the split.
//
// Only a float/double contiguous 3-D or 4-D input whose arguments CPU would
// accept (checked conservatively here); every other call goes where it went
// before this kernel: ATen's composite and the fallback's out= form, which
// run CPU's kernel and report bad arguments as CPU does.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/ops/max_pool2d_with_indices_compositeexplicitautogradnonfunctional_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/kernel_split.h"

namespace openreg {
namespace {

// An input element pooled counts as this many of an add's (single-threaded,
// 2x2 pooling of 200K elements: 0.7 ms, an add of them 0.03-0.04 ms).
constexpr int64_t kMaxPoolWorkPerElement = 20;

// One spatial dimension of a pooling: kernel, stride, padding, dilation.
struct Window {
  int64_t kernel;
  int64_t stride;
  int64_t padding;
  int64_t dilation;

  // The output size CPU computes (pooling_output_shape), or nullopt where
  // CPU might refuse the window (it then reports why): the padding at most
  // half the kernel (pool2d_shape_check's rule, stricter than half the
  // dilated kernel), nothing large enough to overflow.
  std::optional<int64_t> output_size(int64_t input, bool ceil_mode) const {
    constexpr int64_t kLargest = int64_t(1) << 24; // no overflow below
    if (kernel <= 0 || stride <= 0 || dilation <= 0 || padding < 0 || kernel > kLargest || dilation > kLargest ||
        stride > kLargest || padding > kernel / 2) {
      return std::nullopt;
    }
    const int64_t reach = input + 2 * padding - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
    if (reach < 0) {
      return std::nullopt;
    }
    int64_t size = reach / stride + 1;
    if (ceil_mode && (size - 1) * stride >= input + padding) {
      --size; // the last window starts inside the input
    }
    return size;
  }
};

// A window argument's value along dimension `d` (0: height, 1: width): one
// int for both, or one each; nullopt for another length.
std::optional<int64_t> along(c10::IntArrayRef values, size_t d) {
  if (values.size() == 1) {
    return values[0];
  }
  if (values.size() == 2) {
    return values[d];
  }
  return std::nullopt;
}

std::optional<Window> window(
    c10::IntArrayRef kernel_size,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    size_t d) {
  const std::optional<int64_t> kernel = along(kernel_size, d);
  const std::optional<int64_t> step = stride.empty() ? kernel : along(stride, d);
  const std::optional<int64_t> pad = along(padding, d);
  const std::optional<int64_t> dilate = along(dilation, d);
  if (!kernel || !step || !pad || !dilate) {
    return std::nullopt;
  }
  return Window{*kernel, *step, *pad, *dilate};
}

// `a` if `take`, else `b`, by their bits under a mask: never a branch
// (GCC compiles `take ? a : b` for floats to one).
template <typename T>
T select(bool take, T a, T b) {
  using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  static_assert(sizeof(T) == sizeof(Bits));
  const Bits mask = -static_cast<Bits>(take);
  const Bits bits = (std::bit_cast<Bits>(a) & mask) | (std::bit_cast<Bits>(b) & ~mask);
  return std::bit_cast<T>(bits);
}

// Pools `planes` planes [begin, end) of `height` x `width` into
// `out_height` x `out_width` (CPU's cpu_max_pool, with a mask for a branch).
template <typename T>
void max_pool_planes(
    const T* input,
    T* out,
    int64_t* indices,
    int64_t begin,
    int64_t end,
    int64_t height,
    int64_t width,
    int64_t out_height,
    int64_t out_width,
    const Window rows,
    const Window columns) {
  for (int64_t plane = begin; plane < end; ++plane) {
    const T* x = input + plane * height * width;
    T* y = out + plane * out_height * out_width;
    int64_t* index = indices + plane * out_height * out_width;
    for (int64_t oh = 0; oh < out_height; ++oh) {
      int64_t ih0 = oh * rows.stride - rows.padding;
      const int64_t ih1 = std::min(ih0 + (rows.kernel - 1) * rows.dilation + 1, height);
      while (ih0 < 0) {
        ih0 += rows.dilation;
      }
      for (int64_t ow = 0; ow < out_width; ++ow) {
        int64_t iw0 = ow * columns.stride - columns.padding;
        const int64_t iw1 = std::min(iw0 + (columns.kernel - 1) * columns.dilation + 1, width);
        while (iw0 < 0) {
          iw0 += columns.dilation;
        }
        int64_t max_index = ih0 * width + iw0;
        T max_value = -std::numeric_limits<T>::infinity();
        for (int64_t ih = ih0; ih < ih1; ih += rows.dilation) {
          for (int64_t iw = iw0; iw < iw1; iw += columns.dilation) {
            const int64_t i = ih * width + iw;
            const T value = x[i];
            const bool takes = (value > max_value) | std::isnan(value);
            max_value = select(takes, value, max_value);
            max_index = select(takes, i, max_index);
          }
        }
        y[oh * out_width + ow] = max_value;
        index[oh * out_width + ow] = max_index;
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(
    const at::Tensor& input,
    c10::IntArrayRef kernel_size,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    bool ceil_mode) {
  const c10::ScalarType dtype = input.scalar_type();
  const std::optional<Window> rows = window(kernel_size, stride, padding, dilation, 0);
  const std::optional<Window> columns = window(kernel_size, stride, padding, dilation, 1);
  const int64_t dims = input.dim();
  std::optional<int64_t> out_height;
  std::optional<int64_t> out_width;
  if (rows && columns && (dims == 3 || dims == 4)) {
    out_height = rows->output_size(input.size(dims - 2), ceil_mode);
    out_width = columns->output_size(input.size(dims - 1), ceil_mode);
  }
  if (!out_height || !out_width || *out_height < 1 || *out_width < 1 || (dtype != c10::kFloat && dtype != c10::kDouble) ||
      input.numel() == 0 || !input.is_contiguous() || input.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    // What serves the op without this kernel: ATen's composite, which
    // calls max_pool2d_with_indices.out, the fallback under the dtype
    // policy (CUDA refuses integers).
    return at::compositeexplicitautogradnonfunctional::max_pool2d_with_indices(
        input, kernel_size, stride, padding, dilation, ceil_mode);
  }
  c10::DeviceGuard guard(input.device());
  std::vector<int64_t> out_sizes(input.sizes().begin(), input.sizes().end());
  out_sizes[dims - 2] = *out_height;
  out_sizes[dims - 1] = *out_width;
  at::Tensor out = empty_on_current_device(out_sizes, dtype);
  at::Tensor indices = empty_on_current_device(out_sizes, c10::kLong);
  launch(
      input.device().index(),
      [input = kernel_operand(input), out = kernel_operand(out), indices = kernel_operand(indices), rows = *rows,
       columns = *columns] {
        const int64_t dims = input.dim();
        const int64_t height = input.size(dims - 2);
        const int64_t width = input.size(dims - 1);
        const int64_t planes = input.numel() / (height * width);
        const RowRanges ranges(planes, input.numel() * kMaxPoolWorkPerElement);
        AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "openreg max_pool2d_with_indices", [&] {
          run_chunks(ranges.count(), [&](size_t i) {
            max_pool_planes<scalar_t>(
                input.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), indices.data_ptr<int64_t>(),
                ranges.begin(i), ranges.end(i), height, width, out.size(dims - 2), out.size(dims - 1), rows,
                columns);
          });
        });
      },
      launch_mode_for(input.numel()), KernelInfo("aten::max_pool2d_with_indices", {input}, {out, indices}));
  return {out, indices};
}

} // namespace

void register_max_pool(KernelRegistrar& kernels) {
  kernels.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
}

} // namespace openreg
