// Batch normalization in training, split by channels (Note [Split kernels]
// in kernel_split.h). Its statistics are per channel, so a range of
// channels is normalized by the CPU kernel on views that select those
// channels of the input, the parameters and the running statistics (which
// it updates in place), writing the same channels of the output and of the
// saved mean and inverse deviation. The ranges depend on the shapes alone.
//
// Only what pays is split: a float32/float64 contiguous input whose
// parameters share its dtype, in training. Every other call, and one too
// small to split, goes to the boxed fallback as before. Evaluation and the
// backward stay whole: CPU's kernels for them are several times slower on
// a channel range's (non-contiguous) view than on the whole tensor.
#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device_memory.h"
#include "torch_openreg/cpp/dtype_policy.h"
#include "torch_openreg/cpp/kernel_split.h"

namespace openreg {
namespace {

// An element normalized in training counts as this many of an add's:
// single-threaded, 200K elements in 8 channels took 16 times an add's time
// on them (0.52 vs 0.032 ms).
constexpr int64_t kBatchNormWorkPerElement = 16;

using Optional = std::optional<at::Tensor>;

bool defined(const Optional& t) {
  return t.has_value() && t->defined();
}

// The channel ranges of a call that splits; one range (unsplit) otherwise.
RowRanges channel_ranges(
    const at::Tensor& input,
    std::initializer_list<const Optional*> per_channel,
    bool training) {
  const c10::ScalarType dtype = input.scalar_type();
  if (!training || input.dim() < 2 || (dtype != c10::kFloat && dtype != c10::kDouble) || !input.is_contiguous() ||
      input.layout() != c10::kStrided || input.size(1) < 2) {
    return RowRanges();
  }
  for (const Optional* t : per_channel) {
    if (defined(*t) &&
        ((*t)->scalar_type() != dtype || (*t)->dim() != 1 || (*t)->size(0) != input.size(1) ||
         (*t)->device() != input.device() || (*t)->layout() != c10::kStrided)) {
      return RowRanges();
    }
  }
  return RowRanges(input.size(1), input.numel() * kBatchNormWorkPerElement);
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
  const RowRanges channels = channel_ranges(input, {&weight, &bias, &running_mean, &running_var}, training);
  if (!channels.split()) {
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
  const auto operand = [](const Optional& t) { return defined(t) ? kernel_operand(*t) : at::Tensor(); };
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
  queue_kernel(
      input.device().index(),
      [input = kernel_operand(input), weight = operand(weight), bias = operand(bias),
       running_mean = operand(running_mean), running_var = operand(running_var), out = kernel_operand(out),
       save_mean = kernel_operand(save_mean), save_invstd = kernel_operand(save_invstd), momentum, eps, channels] {
        run_chunks(channels.count(), [&](size_t i) {
          const auto part = [&](const at::Tensor& t) -> Optional {
            return t.defined() ? Optional(channels.narrow(t, 0, i)) : std::nullopt;
          };
          const auto [o, mean, invstd] = at::native_batch_norm(
              channels.narrow(input, 1, i), part(weight), part(bias), part(running_mean), part(running_var),
              /*training=*/true, momentum, eps);
          channels.narrow(out, 1, i).copy_(o);
          channels.narrow(save_mean, 0, i).copy_(mean);
          channels.narrow(save_invstd, 0, i).copy_(invstd);
        });
      },
      ffi::LaunchMode::Queue,
      std::move(info));
  return {out, save_mean, save_invstd};
}

} // namespace

void register_batch_norm(KernelRegistrar& kernels) {
  kernels.impl("native_batch_norm", TORCH_FN(native_batch_norm));
}

} // namespace openreg
