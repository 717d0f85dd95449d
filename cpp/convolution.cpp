// Convolutions. ATen routes a backend it does not know to
// convolution_overrideable / convolution_backward_overrideable instead of
// the boxed fallback; these run the CPU convolution on zero-copy views, in
// stream order (see Note [Fallback]), and copy the results to the device.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device_memory.h"
#include "torch_openreg/src/ffi.rs.h"

namespace openreg {
namespace {

std::optional<at::Tensor> optional_view(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? std::optional<at::Tensor>(cpu_view(*t)) : std::nullopt;
}

at::Tensor defined_to_device(const at::Tensor& host, c10::Device device) {
  return host.defined() ? copy_to_device(host, device) : host;
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
  c10::DeviceGuard guard(input.device());
  synchronize_current_stream(input.device().index());
  DeviceAccess access;
  at::Tensor out = at::convolution(
      cpu_view(input), cpu_view(weight), optional_view(bias), stride, padding, dilation, transposed,
      output_padding, groups);
  return copy_to_device(out, input.device());
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
  c10::DeviceGuard guard(input.device());
  synchronize_current_stream(input.device().index());
  DeviceAccess access;
  // The bias has one entry per output channel.
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      cpu_view(grad_output), cpu_view(input), cpu_view(weight), bias_sizes, stride, padding, dilation,
      transposed, output_padding, groups, output_mask);
  return {
      defined_to_device(grad_input, input.device()),
      defined_to_device(grad_weight, input.device()),
      defined_to_device(grad_bias, input.device())};
}

} // namespace

void register_convolution(torch::Library& aten) {
  aten.impl("convolution_overrideable", TORCH_FN(convolution));
  aten.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

} // namespace openreg
