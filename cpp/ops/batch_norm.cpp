// Batch normalization in training, computed per channel by openreg's own
// loops and split by channels (Note [Split kernels] in kernel_split.h).
//
// CPU's training kernels are slow where it matters: their statistics are a
// sequential sum in double per channel (single-threaded, 200K elements in 8
// channels: 0.43 ms, 13 times an add), and on a channel range's view (the
// split) they take their strided path. Here each channel's sums are eight
// partial sums in double (element i of each image's run into lane i mod 8,
// the lanes added pairwise), a fixed order that depends on the shape alone:
// every channel's bits are the same whichever range, thread or route
// computes it. They differ from CPU's in rounding only (double sums of
// float elements). The elementwise parts are CPU's formulas:
//   forward:  out = x * alpha + beta, alpha = invstd * weight,
//             beta = bias - mean * alpha;
//   backward: grad_input = (dy - sum(dy) / n - (x - mean) * k) * invstd * w,
//             k = sum((x - mean) * dy) * invstd^2 / n.
//
// Only float/double, contiguous, in training, with per-channel tensors of
// the input's dtype; every other call (evaluation included) goes to the
// boxed fallback, which runs CPU's kernel and reports bad arguments as CPU
// does.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <array>
#include <cmath>
#include <optional>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/kernel_split.h"

namespace openreg {
namespace {

// An element normalized in training counts as this many of an add's
// (single-threaded, 200K elements in 8 channels: forward 0.116 ms,
// backward 0.128 ms, an add 0.038 ms).
constexpr int64_t kBatchNormWorkPerElement = 4;

using Optional = std::optional<at::Tensor>;

bool defined(const Optional& t) {
  return t.has_value() && t->defined();
}

// Whether openreg's loops compute this call: see the file's comment.
bool computed_here(const at::Tensor& input, std::initializer_list<const Optional*> per_channel) {
  const c10::ScalarType dtype = input.scalar_type();
  if (input.dim() < 2 || (dtype != c10::kFloat && dtype != c10::kDouble) || !input.is_contiguous() ||
      input.layout() != c10::kStrided || input.numel() == 0) {
    return false;
  }
  for (const Optional* t : per_channel) {
    if (defined(*t) &&
        ((*t)->scalar_type() != dtype || (*t)->dim() != 1 || (*t)->size(0) != input.size(1) ||
         (*t)->device() != input.device() || (*t)->layout() != c10::kStrided)) {
      return false;
    }
  }
  return true;
}

RowRanges channel_ranges(const at::Tensor& input) {
  return RowRanges(input.size(1), input.numel() * kBatchNormWorkPerElement);
}

// A per-channel vector of a kernel: element c at data[c * stride]; absent
// when undefined.
template <typename T>
struct PerChannel {
  T* data = nullptr;
  int64_t stride = 0;

  explicit PerChannel(const at::Tensor& t) {
    if (t.defined()) {
      data = static_cast<T*>(t.data_ptr());
      stride = t.stride(0);
    }
  }
  explicit operator bool() const {
    return data != nullptr;
  }
  T& operator[](int64_t c) const {
    return data[c * stride];
  }
};

// A contiguous (N, C, ...) tensor as images of C channel runs of `run`
// elements each.
struct ChannelLayout {
  int64_t images;
  int64_t channels;
  int64_t run;

  explicit ChannelLayout(const at::Tensor& t)
      : images(t.size(0)), channels(t.size(1)), run(t.numel() / (t.size(0) * t.size(1))) {}
  int64_t count() const {
    return images * run;
  }
  // Offset of channel c's run in image b.
  int64_t offset(int64_t b, int64_t c) const {
    return (b * channels + c) * run;
  }
};

// Eight partial sums in double: see the file's comment.
class LaneSum {
 public:
  // Adds f(i) for i < size: element i into lane i mod 8.
  template <typename F>
  void add(int64_t size, F f) {
    int64_t i = 0;
    for (; i + kLanes <= size; i += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        lanes_[k] += f(i + k);
      }
    }
    for (int k = 0; i < size; ++i, ++k) {
      lanes_[k] += f(i);
    }
  }
  double total() const {
    return ((lanes_[0] + lanes_[1]) + (lanes_[2] + lanes_[3])) + ((lanes_[4] + lanes_[5]) + (lanes_[6] + lanes_[7]));
  }

 private:
  static constexpr int kLanes = 8;
  double lanes_[kLanes] = {};
};

template <typename T>
void normalize_channel(
    const ChannelLayout& layout,
    int64_t c,
    const T* input,
    T* out,
    PerChannel<const T> weight,
    PerChannel<const T> bias,
    PerChannel<T> running_mean,
    PerChannel<T> running_var,
    PerChannel<T> save_mean,
    PerChannel<T> save_invstd,
    double momentum,
    double eps) {
  const int64_t n = layout.count();
  LaneSum sum;
  for (int64_t b = 0; b < layout.images; ++b) {
    const T* x = input + layout.offset(b, c);
    sum.add(layout.run, [x](int64_t i) { return static_cast<double>(x[i]); });
  }
  const double mean = sum.total() / static_cast<double>(n);
  LaneSum squares;
  for (int64_t b = 0; b < layout.images; ++b) {
    const T* x = input + layout.offset(b, c);
    squares.add(layout.run, [x, mean](int64_t i) {
      const double d = static_cast<double>(x[i]) - mean;
      return d * d;
    });
  }
  const double var_sum = squares.total();
  save_mean[c] = static_cast<T>(mean);
  save_invstd[c] = static_cast<T>(1 / std::sqrt(var_sum / static_cast<double>(n) + eps));
  if (running_mean) {
    running_mean[c] = static_cast<T>(momentum * mean + (1 - momentum) * running_mean[c]);
  }
  if (running_var) {
    const double unbiased = var_sum / static_cast<double>(n - 1);
    running_var[c] = static_cast<T>(momentum * unbiased + (1 - momentum) * running_var[c]);
  }
  const T alpha = save_invstd[c] * (weight ? weight[c] : T(1));
  const T beta = (bias ? bias[c] : T(0)) - save_mean[c] * alpha;
  for (int64_t b = 0; b < layout.images; ++b) {
    const T* x = input + layout.offset(b, c);
    T* y = out + layout.offset(b, c);
    for (int64_t i = 0; i < layout.run; ++i) {
      y[i] = x[i] * alpha + beta;
    }
  }
}

template <typename T>
void normalize_backward_channel(
    const ChannelLayout& layout,
    int64_t c,
    const T* grad_out,
    const T* input,
    T* grad_input,
    PerChannel<const T> weight,
    PerChannel<const T> save_mean,
    PerChannel<const T> save_invstd,
    PerChannel<T> grad_weight,
    PerChannel<T> grad_bias) {
  const int64_t n = layout.count();
  const T mean = save_mean[c];
  const T invstd = save_invstd[c];
  LaneSum sum;
  LaneSum dot;
  for (int64_t b = 0; b < layout.images; ++b) {
    const T* dy = grad_out + layout.offset(b, c);
    const T* x = input + layout.offset(b, c);
    sum.add(layout.run, [dy](int64_t i) { return static_cast<double>(dy[i]); });
    dot.add(layout.run, [dy, x, mean](int64_t i) { return static_cast<double>((x[i] - mean) * dy[i]); });
  }
  const T dy_sum = static_cast<T>(sum.total());
  const T dot_product = static_cast<T>(dot.total());
  if (grad_input) {
    const T k = dot_product * invstd * invstd / static_cast<T>(n);
    const T dy_mean = dy_sum / static_cast<T>(n);
    const T scale = invstd * (weight ? weight[c] : T(1));
    for (int64_t b = 0; b < layout.images; ++b) {
      const T* dy = grad_out + layout.offset(b, c);
      const T* x = input + layout.offset(b, c);
      T* dx = grad_input + layout.offset(b, c);
      for (int64_t i = 0; i < layout.run; ++i) {
        dx[i] = (dy[i] - dy_mean - (x[i] - mean) * k) * scale;
      }
    }
  }
  if (grad_weight) {
    grad_weight[c] = dot_product * invstd;
  }
  if (grad_bias) {
    grad_bias[c] = dy_sum;
  }
}

at::Tensor operand_or_undefined(const Optional& t) {
  return defined(t) ? kernel_operand(*t) : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input,
    const Optional& weight,
    const Optional& bias,
    const Optional& running_mean,
    const Optional& running_var,
    bool training,
    double momentum,
    double eps) {
  if (!training || !computed_here(input, {&weight, &bias, &running_mean, &running_var})) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_batch_norm", "");
    torch::jit::Stack stack;
    torch::jit::push(stack, input, weight, bias, running_mean, running_var, training, momentum, eps);
    run_fallback(op, &stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
  }
  c10::DeviceGuard guard(input.device());
  at::Tensor out = empty_on_current_device(input.sizes(), input.scalar_type());
  at::Tensor save_mean = empty_on_current_device({input.size(1)}, input.scalar_type());
  at::Tensor save_invstd = empty_on_current_device({input.size(1)}, input.scalar_type());
  KernelInfo info("aten::native_batch_norm", {input}, {out, save_mean, save_invstd});
  for (const Optional* t : {&weight, &bias}) {
    if (defined(*t)) {
      info.add(**t, false);
    }
  }
  for (const Optional* t : {&running_mean, &running_var}) {
    if (defined(*t)) {
      info.add(**t, true); // updated in place
    }
  }
  launch(
      input.device().index(),
      [input = kernel_operand(input), weight = operand_or_undefined(weight), bias = operand_or_undefined(bias),
       running_mean = operand_or_undefined(running_mean), running_var = operand_or_undefined(running_var),
       out = kernel_operand(out), save_mean = kernel_operand(save_mean), save_invstd = kernel_operand(save_invstd),
       momentum, eps] {
        const ChannelLayout layout(input);
        const RowRanges channels = channel_ranges(input);
        AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "openreg native_batch_norm", [&] {
          run_chunks(channels.count(), [&](size_t i) {
            for (int64_t c = channels.begin(i); c < channels.end(i); ++c) {
              normalize_channel<scalar_t>(
                  layout, c, input.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                  PerChannel<const scalar_t>(weight), PerChannel<const scalar_t>(bias),
                  PerChannel<scalar_t>(running_mean), PerChannel<scalar_t>(running_var),
                  PerChannel<scalar_t>(save_mean), PerChannel<scalar_t>(save_invstd), momentum, eps);
            }
          });
        });
      },
      launch_mode_for(input.numel()), std::move(info));
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const Optional& weight,
    const Optional& running_mean,
    const Optional& running_var,
    const Optional& save_mean,
    const Optional& save_invstd,
    bool train,
    double eps,
    std::array<bool, 3> output_mask) {
  // CPU's kernel makes grad_weight like the weight: without one it fails,
  // as it does through the fallback.
  if (!train || !defined(save_mean) || !defined(save_invstd) || (output_mask[1] && !defined(weight)) ||
      !grad_out.is_contiguous() || grad_out.sizes() != input.sizes() ||
      grad_out.scalar_type() != input.scalar_type() || grad_out.device() != input.device() ||
      !computed_here(input, {&weight, &running_mean, &running_var, &save_mean, &save_invstd})) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_batch_norm_backward", "");
    torch::jit::Stack stack;
    torch::jit::push(stack, grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                     c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]}));
    run_fallback(op, &stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
  }
  c10::DeviceGuard guard(input.device());
  const auto maybe_empty = [&](bool wanted, c10::IntArrayRef sizes) {
    return wanted ? empty_on_current_device(sizes, input.scalar_type()) : at::Tensor();
  };
  at::Tensor grad_input = maybe_empty(output_mask[0], input.sizes());
  at::Tensor grad_weight = maybe_empty(output_mask[1], {input.size(1)});
  at::Tensor grad_bias = maybe_empty(output_mask[2], {input.size(1)});
  KernelInfo info("aten::native_batch_norm_backward", {grad_out, input, *save_mean, *save_invstd}, {});
  if (defined(weight)) {
    info.add(*weight, false);
  }
  for (const at::Tensor& t : {grad_input, grad_weight, grad_bias}) {
    if (t.defined()) {
      info.add(t, true);
    }
  }
  launch(
      input.device().index(),
      [grad_out = kernel_operand(grad_out), input = kernel_operand(input), weight = operand_or_undefined(weight),
       save_mean = kernel_operand(*save_mean), save_invstd = kernel_operand(*save_invstd),
       grad_input = operand_or_undefined(grad_input), grad_weight = operand_or_undefined(grad_weight),
       grad_bias = operand_or_undefined(grad_bias)] {
        const ChannelLayout layout(input);
        const RowRanges channels = channel_ranges(input);
        AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "openreg native_batch_norm_backward", [&] {
          run_chunks(channels.count(), [&](size_t i) {
            for (int64_t c = channels.begin(i); c < channels.end(i); ++c) {
              normalize_backward_channel<scalar_t>(
                  layout, c, grad_out.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                  grad_input.defined() ? grad_input.data_ptr<scalar_t>() : nullptr,
                  PerChannel<const scalar_t>(weight), PerChannel<const scalar_t>(save_mean),
                  PerChannel<const scalar_t>(save_invstd), PerChannel<scalar_t>(grad_weight),
                  PerChannel<scalar_t>(grad_bias));
            }
          });
        });
      },
      launch_mode_for(input.numel()), std::move(info));
  return {grad_input, grad_weight, grad_bias};
}

} // namespace

void register_batch_norm(KernelRegistrar& kernels) {
  kernels.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  kernels.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
}

} // namespace openreg
