// Convolutions. ATen routes a backend it does not know to
// convolution_overrideable / convolution_backward_overrideable instead of
// the boxed fallback. Their result shapes follow from the arguments alone,
// so the results are allocated up front and the CPU convolution runs on
// zero-copy views as a kernel on the current stream (Note [One door]),
// writing them in place.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <algorithm>
#include <vector>

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/kernel_split.h"
#include "torch_openreg/cpp/ops/result_format.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

// As CUDA: every tensor of the call is on the input's device.
void check_same_device(const at::Tensor& input, const at::Tensor& t, const char* what, const char* op) {
  TORCH_CHECK(
      !t.defined() || t.device() == input.device(),
      "Expected all tensors to be on the same device, but found at least two devices, ", input.device(), " and ",
      t.device(), "! (when checking argument for argument ", what, " in method ", op, ")");
}

// A new openreg tensor of `sizes` for a result of the convolution of
// `input` by `weight`: in CUDA's memory format (Note [Memory format of
// results] in result_format.h), which cuDNN gives the output and both
// gradients alike (convolution_backward in
// aten/src/ATen/native/Convolution.cpp makes grad_output and weight
// contiguous in it before cuDNN allocates the gradients).
at::Tensor empty_result(c10::IntArrayRef sizes, const at::Tensor& input, const at::Tensor& weight) {
  return empty_on_current_device(sizes, input.scalar_type(), convolution_memory_format(input, weight));
}

// A convolution's chunks: ranges of the batch, by its multiply-adds
// (Note [Split kernels] in kernel_split.h).
RowRanges batch_ranges(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& out) {
  if (input.dim() < 3 || input.size(0) != out.size(0)) {
    return RowRanges();
  }
  // Each output element takes `inner` = weight.numel() / out channels
  // multiply-adds. CPU's convolution is a matrix product over `inner`, and
  // as fast per multiply-add as a large one only when `inner` is large:
  // measured single-threaded against an add's element, a 3x3 convolution
  // from 1 channel (inner 9) did 3.6 multiply-adds in its time, from 8
  // channels (inner 72) 23. About inner / 3, up to a matrix product's 32.
  const int64_t out_channels = std::max<int64_t>(out.size(1), 1);
  const int64_t inner = std::max<int64_t>(weight.numel() / out_channels, 1);
  const int64_t multiply_adds_per_element = std::clamp<int64_t>(inner / 3, 1, 32);
  return RowRanges(input.size(0), out.numel() * inner / multiply_adds_per_element);
}

std::optional<at::Tensor> optional_operand(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? std::optional<at::Tensor>(kernel_operand(*t)) : std::nullopt;
}

at::Tensor convolution(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    bool transposed,
    c10::IntArrayRef output_padding,
    int64_t groups) {
  check_same_device(input, weight, "weight", "convolution");
  check_same_device(input, bias.value_or(at::Tensor()), "bias", "convolution");
  TORCH_CHECK(input.dim() == weight.dim(), "convolution: input and weight need the same number of dimensions, got ",
              input.dim(), " and ", weight.dim());
  c10::DeviceGuard guard(input.device());
  const std::vector<int64_t> out_sizes = transposed
      ? at::native::_conv_input_size(input.sizes(), weight.sizes(), padding, output_padding, stride, dilation, groups)
      : at::native::conv_output_size(input.sizes(), weight.sizes(), padding, stride, dilation);
  at::Tensor out = empty_result(out_sizes, input, weight);
  queue_kernel(
      input.device().index(),
      [out = kernel_operand(out), input = kernel_operand(input), weight = kernel_operand(weight),
       bias = optional_operand(bias), stride = stride.vec(), padding = padding.vec(), dilation = dilation.vec(),
       transposed, output_padding = output_padding.vec(), groups, batch = batch_ranges(input, weight, out)] {
        run_chunks(batch.count(), [&](size_t i) {
          batch.narrow(out, 0, i).copy_(at::convolution(
              batch.narrow(input, 0, i), weight, bias, stride, padding, dilation, transposed, output_padding, groups));
        });
      },
      launch_mode_for(out.numel()),
      KernelInfo("aten::convolution", {input, weight, bias.value_or(at::Tensor())}, {out}));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& weight,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    bool transposed,
    c10::IntArrayRef output_padding,
    int64_t groups,
    std::array<bool, 3> output_mask) {
  check_same_device(input, weight, "weight", "convolution_backward");
  check_same_device(input, grad_output, "grad_output", "convolution_backward");
  c10::DeviceGuard guard(input.device());
  // The bias has one entry per output channel.
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  at::Tensor grad_input = output_mask[0] ? empty_result(input.sizes(), input, weight) : at::Tensor();
  at::Tensor grad_weight = output_mask[1] ? empty_result(weight.sizes(), input, weight) : at::Tensor();
  at::Tensor grad_bias = output_mask[2] ? empty_on_current_device({channels}, weight.scalar_type()) : at::Tensor();
  queue_kernel(
      input.device().index(),
      [grad_input = kernel_operand(grad_input), grad_weight = kernel_operand(grad_weight),
       grad_bias = kernel_operand(grad_bias), grad_output = kernel_operand(grad_output),
       input = kernel_operand(input), weight = kernel_operand(weight), channels, stride = stride.vec(),
       padding = padding.vec(), dilation = dilation.vec(), transposed, output_padding = output_padding.vec(), groups,
       output_mask, batch = batch_ranges(input, weight, grad_output)] {
        // Split by batch: chunks of grad_input rows, then chunks that each
        // compute their rows' share of the weight and bias gradients (sums
        // over the batch). The shares are added in chunk order, so these
        // sums too depend on the shapes alone; unsplit, the kernel is CPU's.
        const bool sums = output_mask[1] || output_mask[2];
        const size_t input_chunks = output_mask[0] ? batch.count() : 0;
        const size_t sum_chunks = sums ? batch.count() : 0;
        std::vector<at::Tensor> weight_shares(std::max<size_t>(sum_chunks, 1));
        std::vector<at::Tensor> bias_shares(weight_shares.size());
        const auto backward = [&](size_t range, std::array<bool, 3> mask) {
          const auto rows = [&](const at::Tensor& t) { return batch.split() ? batch.narrow(t, 0, range) : t; };
          return at::convolution_backward(
              rows(grad_output), rows(input), weight, std::vector<int64_t>{channels}, stride, padding, dilation,
              transposed, output_padding, groups, mask);
        };
        if (!batch.split()) {
          const auto results = backward(0, output_mask);
          if (output_mask[0]) {
            grad_input.copy_(std::get<0>(results));
          }
          weight_shares[0] = std::get<1>(results);
          bias_shares[0] = std::get<2>(results);
        } else {
          run_chunks(input_chunks + sum_chunks, [&](size_t i) {
            if (i < input_chunks) {
              batch.narrow(grad_input, 0, i).copy_(std::get<0>(backward(i, {true, false, false})));
              return;
            }
            const size_t range = i - input_chunks;
            const auto results = backward(range, {false, output_mask[1], output_mask[2]});
            weight_shares[range] = std::get<1>(results);
            bias_shares[range] = std::get<2>(results);
          });
        }
        for (auto [dst, shares] : {std::pair{grad_weight, &weight_shares}, std::pair{grad_bias, &bias_shares}}) {
          if (!dst.defined()) {
            continue;
          }
          dst.copy_((*shares)[0]);
          for (size_t range = 1; range < shares->size(); ++range) {
            dst.add_((*shares)[range]);
          }
        }
      },
      launch_mode_for(input.numel()),
      KernelInfo(
          "aten::convolution_backward", {grad_output, input, weight}, {grad_input, grad_weight, grad_bias}));
  return {grad_input, grad_weight, grad_bias};
}

} // namespace

void register_convolution(KernelRegistrar& kernels) {
  kernels.impl("convolution_overrideable", TORCH_FN(convolution));
  kernels.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

} // namespace openreg
