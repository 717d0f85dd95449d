// Kernels of aten ops that PyTorch implements for CUDA and not for the CPU,
// but that its device-generic code calls for any accelerator tensor.
//
// Note [Accelerator-only ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The boxed fallback runs an op's CPU kernel (Note [Fallback]); an op with a
// CUDA kernel and no CPU (or composite) kernel has nothing to run there. Of
// the 94 aten ops of that kind in torch 2.15 (the dispatcher lists them:
// torch._C._dispatch_has_kernel_for_dispatch_key), these are reached for a
// PrivateUse1 tensor, and are implemented here with CUDA's formulas
// (computing in float for float16/bfloat16, as CUDA's kernels do):
//  - the fused RNN cells: nn.LSTM, nn.GRU, nn.LSTMCell and nn.GRUCell take
//    them for `is_privateuseone()` inputs (aten/src/ATen/native/RNN.cpp):
//    _thnn_fused_lstm_cell, _thnn_fused_lstm_cell_backward_impl,
//    _thnn_fused_gru_cell, _thnn_fused_gru_cell_backward;
//  - SyncBatchNorm's statistics, called for any accelerator under
//    torch.distributed (torch/nn/modules/_functions.py): batch_norm_stats,
//    batch_norm_elemt (and .out), batch_norm_gather_stats,
//    batch_norm_gather_stats_with_counts, batch_norm_backward_reduce,
//    batch_norm_backward_elemt;
//  - public functions with no device check: torch._fused_dropout (p is the
//    probability to keep), torch._masked_scale (its derivative), and the
//    out_dtype matmuls mm.dtype, bmm.dtype, addmm.dtype, baddbmm.dtype and
//    their .dtype_out forms (float16/bfloat16 inputs to a float32 result,
//    or the inputs' own dtype, as CUDA allows).
// Implemented elsewhere, as the ops a library calls by name:
//  - the flash and memory-efficient attention operators,
//    _flash_attention_forward, _flash_attention_backward,
//    _flash_attention_forward_no_dropout_inplace (varlen_attn's out= form),
//    _efficient_attention_forward and _efficient_attention_backward
//    (cpp/frontends/flash_efficient_attention.cpp, Note [Flash and efficient
//    attention]).
// Not reached for a PrivateUse1 tensor, so not implemented:
//  - cudnn_*, _cudnn_*, miopen_*, _use_cudnn_ctc_loss, _use_miopen_ctc_loss:
//    chosen only for CUDA/HIP tensors (ctc_loss, convolution, batch_norm and
//    the RNNs check the device before asking);
//  - _conv_depthwise2d, conv_depthwise3d: convolution picks them only for
//    CUDA tensors (openreg's convolution is convolution_overrideable);
//  - sdpa's CUDA backends, _scaled_dot_product_flash_attention,
//    _scaled_dot_product_efficient_attention and
//    _scaled_dot_product_cudnn_attention (and their backward and .quantized
//    forms) and the float8 flash forward (_flash_attention_forward.quantized,
//    FA3 only on CUDA): sdpa picks them only for CUDA (openreg answers
//    OVERRIDEABLE, Note [Fused attention]);
//  - _fused_rms_norm_backward: _fused_rms_norm decomposes (its composite
//    kernel) on every device but CUDA, so its backward is never asked for;
//  - GPU-specific features a program asks for by name, with no device-generic
//    caller: 2:4 sparsity (_cslt_*, _sparse_semi_structured_*,
//    _to_sparse_semi_structured), int4 packing (_convert_weight_to_int4pack,
//    _weight_int4pack_mm; the CPU has its own *_for_cpu ops), scaled and
//    grouped float8 matmuls (_scaled_addmm, _scaled_grouped_mm*),
//    _mixed_dtypes_linear, _triton_*, _fill_mem_eff_dropout_mask_;
//  - record_stream has openreg's own kernel (ops.cpp).
// Each kernel here is one launch on the current stream (Note [One door]):
// the results are allocated first and a CPU computation on views of the
// device memory fills them.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/AccumulateType.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_masked_scale.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/batch_norm_gather_stats_with_counts.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

// float16/bfloat16 are computed in float, as CUDA's accscalar_t.
at::Tensor in_compute_dtype(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  const auto dtype = t.scalar_type();
  return dtype == at::kHalf || dtype == at::kBFloat16 ? t.to(at::kFloat) : t;
}

at::Tensor operand(const at::Tensor& t) {
  return t.defined() ? kernel_operand(t) : t;
}

at::Tensor optional_tensor(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

void check_same_device(const char* op, const at::Tensor& first, std::initializer_list<at::Tensor> others) {
  for (const at::Tensor& t : others) {
    TORCH_CHECK(
        !t.defined() || t.device() == first.device(), "Expected all tensors to be on the same device, but found at ",
        "least two devices, ", first.device(), " and ", t.device(), "! (when checking arguments for ", op, ")");
  }
}

// Runs `body` (on CPU views) as one kernel on the current stream of
// `device`; `writes` are the results it fills.
template <typename Body>
void launch_on(
    const at::Tensor& on,
    const char* name,
    std::initializer_list<at::Tensor> reads,
    std::initializer_list<at::Tensor> writes,
    Body&& body) {
  int64_t numel = 0;
  for (const at::Tensor& t : reads) {
    numel = std::max(numel, t.defined() ? t.numel() : 0);
  }
  launch(on.device().index(), std::forward<Body>(body), launch_mode_for(numel), KernelInfo(name, reads, writes));
}

// ---------------------------------------------------------------------------
// Fused LSTM and GRU cells (CUDA: aten/src/ATen/native/cuda/RNN.cu).

// A fused cell's biases (both or neither), after checking the call's
// shapes (gates of (batch, `gates` * hidden), a state of (batch, hidden))
// and devices.
std::pair<at::Tensor, at::Tensor> checked_cell_biases(
    const char* op,
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& state,
    int64_t gates,
    const std::optional<at::Tensor>& input_bias_opt,
    const std::optional<at::Tensor>& hidden_bias_opt) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(), op,
              ": input_gates and hidden_gates must be 2-D of the same size, got ", input_gates.sizes(), " and ",
              hidden_gates.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == input_gates.size(0) &&
                  state.size(1) * gates == input_gates.size(1),
              op, ": the state must be (batch, hidden) for gates of (batch, ", gates, " * hidden), got ",
              state.sizes(), " for ", input_gates.sizes());
  at::Tensor input_bias = optional_tensor(input_bias_opt);
  at::Tensor hidden_bias = optional_tensor(hidden_bias_opt);
  TORCH_CHECK(input_bias.defined() == hidden_bias.defined(), op, ": give both biases or neither");
  check_same_device(op, input_gates, {hidden_gates, state, input_bias, hidden_bias});
  return {input_bias, hidden_bias};
}

// gates = input_gates + hidden_gates (+ input_bias + hidden_bias).
at::Tensor summed_gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& input_bias,
                        const at::Tensor& hidden_bias) {
  at::Tensor gates = in_compute_dtype(input_gates) + in_compute_dtype(hidden_gates);
  if (input_bias.defined()) {
    gates = gates + in_compute_dtype(input_bias) + in_compute_dtype(hidden_bias);
  }
  return gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias_opt,
    const std::optional<at::Tensor>& hidden_bias_opt) {
  const auto [input_bias, hidden_bias] = checked_cell_biases(
      "_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4, input_bias_opt, hidden_bias_opt);
  c10::DeviceGuard guard(input_gates.device());
  at::Tensor hy = at::empty_like(cx, at::MemoryFormat::Contiguous);
  at::Tensor cy = at::empty_like(cx, at::MemoryFormat::Contiguous);
  at::Tensor workspace = at::empty_like(input_gates, at::MemoryFormat::Contiguous);
  launch_on(
      input_gates, "aten::_thnn_fused_lstm_cell", {input_gates, hidden_gates, cx, input_bias, hidden_bias},
      {hy, cy, workspace},
      [ig = operand(input_gates), hg = operand(hidden_gates), cx = operand(cx), ib = operand(input_bias),
       hb = operand(hidden_bias), hy = operand(hy), cy = operand(cy), workspace = operand(workspace)] {
        auto gates = summed_gates(ig, hg, ib, hb).chunk(4, 1);
        at::Tensor in_gate = gates[0].sigmoid();
        at::Tensor forget_gate = gates[1].sigmoid();
        at::Tensor cell_gate = gates[2].tanh();
        at::Tensor out_gate = gates[3].sigmoid();
        at::Tensor cell = forget_gate * in_compute_dtype(cx) + in_gate * cell_gate;
        hy.copy_(out_gate * cell.tanh());
        cy.copy_(cell);
        workspace.copy_(at::cat({in_gate, forget_gate, cell_gate, out_gate}, 1));
      });
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy_opt,
    const std::optional<at::Tensor>& grad_cy_opt,
    const at::Tensor& cx,
    const at::Tensor& cy,
    const at::Tensor& workspace,
    bool has_bias) {
  const at::Tensor grad_hy = optional_tensor(grad_hy_opt);
  const at::Tensor grad_cy = optional_tensor(grad_cy_opt);
  if (!grad_hy.defined() && !grad_cy.defined()) {
    return {}; // as CUDA: nothing flows back
  }
  check_same_device("_thnn_fused_lstm_cell_backward_impl", cx, {grad_hy, grad_cy, cy, workspace});
  c10::DeviceGuard guard(cx.device());
  at::Tensor grad_gates = at::empty_like(workspace, at::MemoryFormat::Contiguous);
  at::Tensor grad_cx = at::empty_like(cx, at::MemoryFormat::Contiguous);
  launch_on(
      cx, "aten::_thnn_fused_lstm_cell_backward_impl", {grad_hy, grad_cy, cx, cy, workspace}, {grad_gates, grad_cx},
      [grad_hy = operand(grad_hy), grad_cy = operand(grad_cy), cx = operand(cx), cy = operand(cy),
       workspace = operand(workspace), grad_gates = operand(grad_gates), grad_cx = operand(grad_cx)] {
        auto gates = in_compute_dtype(workspace).chunk(4, 1);
        const at::Tensor& in_gate = gates[0];
        const at::Tensor& forget_gate = gates[1];
        const at::Tensor& cell_gate = gates[2];
        const at::Tensor& out_gate = gates[3];
        const at::Tensor cell = in_compute_dtype(cy);
        const at::Tensor ghy = grad_hy.defined() ? in_compute_dtype(grad_hy) : at::zeros_like(cell);
        const at::Tensor tanh_cell = cell.tanh();
        at::Tensor g_out = ghy * tanh_cell * (1 - out_gate) * out_gate;
        at::Tensor g_cell = ghy * out_gate * (1 - tanh_cell * tanh_cell);
        if (grad_cy.defined()) {
          g_cell = g_cell + in_compute_dtype(grad_cy);
        }
        at::Tensor g_in = g_cell * cell_gate * (1 - in_gate) * in_gate;
        at::Tensor g_forget = g_cell * in_compute_dtype(cx) * (1 - forget_gate) * forget_gate;
        at::Tensor g_cell_gate = g_cell * in_gate * (1 - cell_gate * cell_gate);
        grad_gates.copy_(at::cat({g_in, g_forget, g_cell_gate, g_out}, 1));
        grad_cx.copy_(g_cell * forget_gate);
      });
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias_opt,
    const std::optional<at::Tensor>& hidden_bias_opt) {
  const auto [input_bias, hidden_bias] = checked_cell_biases(
      "_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3, input_bias_opt, hidden_bias_opt);
  c10::DeviceGuard guard(input_gates.device());
  at::Tensor hy = at::empty_like(hx, at::MemoryFormat::Contiguous);
  at::Tensor workspace = at::empty({hx.size(0), hx.size(1) * 5}, hx.options());
  launch_on(
      input_gates, "aten::_thnn_fused_gru_cell", {input_gates, hidden_gates, hx, input_bias, hidden_bias},
      {hy, workspace},
      [ig = operand(input_gates), hg = operand(hidden_gates), hx = operand(hx), ib = operand(input_bias),
       hb = operand(hidden_bias), hy = operand(hy), workspace = operand(workspace)] {
        auto in = in_compute_dtype(ig).chunk(3, 1);
        auto hidden = in_compute_dtype(hg).chunk(3, 1);
        if (ib.defined()) {
          auto in_bias = in_compute_dtype(ib).chunk(3, 0);
          auto hidden_bias = in_compute_dtype(hb).chunk(3, 0);
          for (size_t i = 0; i < 3; ++i) {
            in[i] = in[i] + in_bias[i];
            hidden[i] = hidden[i] + hidden_bias[i];
          }
        }
        at::Tensor reset_gate = (in[0] + hidden[0]).sigmoid();
        at::Tensor update_gate = (in[1] + hidden[1]).sigmoid();
        at::Tensor new_gate = (in[2] + reset_gate * hidden[2]).tanh();
        const at::Tensor state = in_compute_dtype(hx);
        hy.copy_(new_gate + update_gate * (state - new_gate));
        workspace.copy_(at::cat({reset_gate, update_gate, new_gate, state, hidden[2]}, 1));
      });
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy,
    const at::Tensor& workspace,
    bool has_bias) {
  check_same_device("_thnn_fused_gru_cell_backward", grad_hy, {workspace});
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(1) == grad_hy.size(1) * 5,
              "_thnn_fused_gru_cell_backward: the workspace must be (batch, 5 * hidden) for grad_hy of ",
              grad_hy.sizes(), ", got ", workspace.sizes());
  c10::DeviceGuard guard(grad_hy.device());
  const int64_t batch = grad_hy.size(0);
  const int64_t hidden = grad_hy.size(1);
  at::Tensor grad_input_gates = at::empty({batch, hidden * 3}, grad_hy.options());
  at::Tensor grad_hidden_gates = at::empty({batch, hidden * 3}, grad_hy.options());
  at::Tensor grad_hx = at::empty({batch, hidden}, grad_hy.options());
  launch_on(
      grad_hy, "aten::_thnn_fused_gru_cell_backward", {grad_hy, workspace},
      {grad_input_gates, grad_hidden_gates, grad_hx},
      [grad_hy = operand(grad_hy), workspace = operand(workspace), grad_input_gates = operand(grad_input_gates),
       grad_hidden_gates = operand(grad_hidden_gates), grad_hx = operand(grad_hx)] {
        auto saved = in_compute_dtype(workspace).chunk(5, 1);
        const at::Tensor& reset_gate = saved[0];
        const at::Tensor& update_gate = saved[1];
        const at::Tensor& new_gate = saved[2];
        const at::Tensor& state = saved[3];
        const at::Tensor& hidden_new = saved[4]; // the hidden part of the new gate, bias included
        const at::Tensor go = in_compute_dtype(grad_hy);
        at::Tensor g_update = go * (state - new_gate) * (1 - update_gate) * update_gate;
        at::Tensor g_new = go * (1 - update_gate) * (1 - new_gate * new_gate);
        at::Tensor g_hidden_new = g_new * reset_gate;
        at::Tensor g_reset = g_new * hidden_new * (1 - reset_gate) * reset_gate;
        grad_input_gates.copy_(at::cat({g_reset, g_update, g_new}, 1));
        grad_hidden_gates.copy_(at::cat({g_reset, g_update, g_hidden_new}, 1));
        grad_hx.copy_(go * update_gate);
      });
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

// ---------------------------------------------------------------------------
// Dropout's CUDA-only forms (CUDA: aten/src/ATen/native/cuda/Dropout.cu).

std::tuple<at::Tensor, at::Tensor> fused_dropout(const at::Tensor& self, double keep, std::optional<at::Generator> gen) {
  TORCH_CHECK(keep >= 0 && keep <= 1, "_fused_dropout: the probability to keep an element must be in [0, 1], got ",
              keep);
  c10::DeviceGuard guard(self.device());
  at::Tensor mask = at::empty_like(self, self.options().dtype(at::kByte)).bernoulli_(keep, std::move(gen));
  return {at::_masked_scale(self, mask, 1.0 / keep), mask};
}

at::Tensor masked_scale(const at::Tensor& self, const at::Tensor& mask, double scale) {
  TORCH_CHECK(mask.scalar_type() == at::kByte, "_masked_scale: the mask must be uint8, got ", mask.scalar_type());
  check_same_device("_masked_scale", self, {mask});
  c10::DeviceGuard guard(self.device());
  at::Tensor out = at::empty_like(self);
  launch_on(self, "aten::_masked_scale", {self, mask}, {out},
            [self = operand(self), mask = operand(mask), out = operand(out), scale] {
              out.copy_(in_compute_dtype(self) * mask * scale);
            });
  return out;
}

// ---------------------------------------------------------------------------
// Matmuls with an out_dtype (CUDA: aten/src/ATen/native/cuda/Blas.cpp).

void check_out_dtype(const char* op, const at::Tensor& input, at::ScalarType out_dtype) {
  const auto dtype = input.scalar_type();
  TORCH_CHECK(out_dtype == dtype || (out_dtype == at::kFloat && (dtype == at::kHalf || dtype == at::kBFloat16)),
              op, ": out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs");
}

void check_out(const char* op, const at::Tensor& out, at::ScalarType out_dtype) {
  TORCH_CHECK(out.scalar_type() == out_dtype, op, ": out must be of out_dtype ", out_dtype, ", got ", out.scalar_type());
}

at::Tensor mm_dtype(const at::Tensor& self, const at::Tensor& mat2, at::ScalarType out_dtype) {
  check_out_dtype("mm", self, out_dtype);
  return at::mm(self.to(out_dtype), mat2.to(out_dtype));
}

at::Tensor& mm_dtype_out(const at::Tensor& self, const at::Tensor& mat2, at::ScalarType out_dtype, at::Tensor& out) {
  check_out_dtype("mm", self, out_dtype);
  check_out("mm", out, out_dtype);
  return at::mm_out(out, self.to(out_dtype), mat2.to(out_dtype));
}

at::Tensor bmm_dtype(const at::Tensor& self, const at::Tensor& mat2, at::ScalarType out_dtype) {
  check_out_dtype("bmm", self, out_dtype);
  return at::bmm(self.to(out_dtype), mat2.to(out_dtype));
}

at::Tensor& bmm_dtype_out(const at::Tensor& self, const at::Tensor& mat2, at::ScalarType out_dtype, at::Tensor& out) {
  check_out_dtype("bmm", self, out_dtype);
  check_out("bmm", out, out_dtype);
  return at::bmm_out(out, self.to(out_dtype), mat2.to(out_dtype));
}

at::Tensor addmm_dtype(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                       at::ScalarType out_dtype, const at::Scalar& beta, const at::Scalar& alpha) {
  check_out_dtype("addmm", mat1, out_dtype);
  return at::addmm(self.to(out_dtype), mat1.to(out_dtype), mat2.to(out_dtype), beta, alpha);
}

at::Tensor& addmm_dtype_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                            at::ScalarType out_dtype, const at::Scalar& beta, const at::Scalar& alpha,
                            at::Tensor& out) {
  check_out_dtype("addmm", mat1, out_dtype);
  check_out("addmm", out, out_dtype);
  return at::addmm_out(out, self.to(out_dtype), mat1.to(out_dtype), mat2.to(out_dtype), beta, alpha);
}

at::Tensor baddbmm_dtype(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                         at::ScalarType out_dtype, const at::Scalar& beta, const at::Scalar& alpha) {
  check_out_dtype("baddbmm", batch1, out_dtype);
  return at::baddbmm(self.to(out_dtype), batch1.to(out_dtype), batch2.to(out_dtype), beta, alpha);
}

at::Tensor& baddbmm_dtype_out(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                              at::ScalarType out_dtype, const at::Scalar& beta, const at::Scalar& alpha,
                              at::Tensor& out) {
  check_out_dtype("baddbmm", batch1, out_dtype);
  check_out("baddbmm", out, out_dtype);
  return at::baddbmm_out(out, self.to(out_dtype), batch1.to(out_dtype), batch2.to(out_dtype), beta, alpha);
}

// ---------------------------------------------------------------------------
// SyncBatchNorm's statistics (CUDA: aten/src/ATen/native/cuda/Normalization.cu).
// Statistics are per channel (dimension 1), over every other dimension, in
// the accumulate dtype (float for float16/bfloat16 inputs).

std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "batch norm statistics need an input of at least 2 dimensions, got ", input.dim());
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) {
    dims.push_back(d);
  }
  return dims;
}

// A per-channel vector shaped to broadcast over `input` (1, C, 1, ...).
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return v.reshape(shape);
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  c10::DeviceGuard guard(input.device());
  const auto stats_options = input.options().dtype(at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true));
  at::Tensor mean = at::empty({input.size(1)}, stats_options);
  at::Tensor invstd = at::empty({input.size(1)}, stats_options);
  launch_on(input, "aten::batch_norm_stats", {input}, {mean, invstd},
            [input = operand(input), mean = operand(mean), invstd = operand(invstd), eps] {
              const at::Tensor x = in_compute_dtype(input);
              const std::vector<int64_t> dims = reduced_dims(x);
              auto [var, m] = at::var_mean(x, at::IntArrayRef(dims), at::Scalar(0), /*keepdim=*/false);
              mean.copy_(m);
              invstd.copy_((var + eps).rsqrt());
            });
  return {mean, invstd};
}

void batch_norm_elemt_into(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd) {
  check_same_device("batch_norm_elemt", input, {out, weight, bias, mean, invstd});
  launch_on(input, "aten::batch_norm_elemt", {input, weight, bias, mean, invstd}, {out},
            [out = operand(out), input = operand(input), weight = operand(weight), bias = operand(bias),
             mean = operand(mean), invstd = operand(invstd)] {
              const at::Tensor x = in_compute_dtype(input);
              at::Tensor y = (x - per_channel(mean, x)) * per_channel(invstd, x);
              if (weight.defined()) {
                y = y * per_channel(in_compute_dtype(weight), x);
              }
              if (bias.defined()) {
                y = y + per_channel(in_compute_dtype(bias), x);
              }
              out.copy_(y);
            });
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double /*eps: invstd has it*/) {
  c10::DeviceGuard guard(input.device());
  at::Tensor out = at::empty_like(input);
  batch_norm_elemt_into(out, input, optional_tensor(weight), optional_tensor(bias), mean, invstd);
  return out;
}

at::Tensor& batch_norm_elemt_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                 const at::Tensor& invstd, double /*eps*/, at::Tensor& out) {
  c10::DeviceGuard guard(input.device());
  at::native::resize_output(out, input.sizes());
  batch_norm_elemt_into(out, input, optional_tensor(weight), optional_tensor(bias), mean, invstd);
  return out;
}

// Combines per-process statistics (one row each, `counts` elements each)
// into the global mean and invstd, and updates the running statistics
// (with the unbiased variance) in place.
std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean_opt, const std::optional<at::Tensor>& running_var_opt,
    double momentum, double eps, const at::Tensor& counts) {
  const at::Tensor running_mean = optional_tensor(running_mean_opt);
  const at::Tensor running_var = optional_tensor(running_var_opt);
  check_same_device("batch_norm_gather_stats_with_counts", mean, {invstd, running_mean, running_var, counts});
  c10::DeviceGuard guard(mean.device());
  at::Tensor global_mean = at::empty({mean.size(1)}, mean.options());
  at::Tensor global_invstd = at::empty({mean.size(1)}, mean.options());
  launch_on(
      mean, "aten::batch_norm_gather_stats_with_counts", {mean, invstd, counts, running_mean, running_var},
      {global_mean, global_invstd, running_mean, running_var},
      [mean = operand(mean), invstd = operand(invstd), counts = operand(counts), running_mean = operand(running_mean),
       running_var = operand(running_var), global_mean = operand(global_mean),
       global_invstd = operand(global_invstd), momentum, eps] {
        const at::Tensor n = counts.to(mean.scalar_type()).unsqueeze(1); // (world, 1)
        const at::Tensor total = n.sum();
        const at::Tensor m = (mean * n).sum(0) / total;
        const at::Tensor var_each = invstd.pow(-2) - eps;
        const at::Tensor var = (n * (var_each + (mean - m).pow(2))).sum(0) / total;
        global_mean.copy_(m);
        global_invstd.copy_((var + eps).rsqrt());
        if (running_mean.defined()) {
          running_mean.copy_(running_mean * (1 - momentum) + m * momentum);
        }
        if (running_var.defined()) {
          running_var.copy_(running_var * (1 - momentum) + var * (total / (total - 1)) * momentum);
        }
      });
  return {global_mean, global_invstd};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps, int64_t count) {
  c10::DeviceGuard guard(mean.device());
  at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return at::batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  check_same_device("batch_norm_backward_reduce", input, {grad_out, mean, invstd, optional_tensor(weight)});
  c10::DeviceGuard guard(input.device());
  const int64_t channels = input.size(1);
  const auto stats_options = mean.options();
  const auto param_options = weight.has_value() && weight->defined() ? weight->options() : input.options();
  at::Tensor sum_dy = input_g ? at::empty({channels}, stats_options) : at::Tensor();
  at::Tensor sum_dy_xmu = input_g ? at::empty({channels}, stats_options) : at::Tensor();
  at::Tensor grad_weight = weight_g ? at::empty({channels}, param_options) : at::Tensor();
  at::Tensor grad_bias = bias_g ? at::empty({channels}, param_options) : at::Tensor();
  launch_on(
      input, "aten::batch_norm_backward_reduce", {grad_out, input, mean, invstd},
      {sum_dy, sum_dy_xmu, grad_weight, grad_bias},
      [grad_out = operand(grad_out), input = operand(input), mean = operand(mean), invstd = operand(invstd),
       sum_dy = operand(sum_dy), sum_dy_xmu = operand(sum_dy_xmu), grad_weight = operand(grad_weight),
       grad_bias = operand(grad_bias)] {
        const at::Tensor x = in_compute_dtype(input);
        const at::Tensor dy = in_compute_dtype(grad_out);
        const auto dims = reduced_dims(x);
        const at::Tensor dy_sum = dy.sum(dims);
        const at::Tensor dy_xmu_sum = (dy * (x - per_channel(mean, x))).sum(dims);
        for (auto [dst, src] : {std::pair{sum_dy, dy_sum}, std::pair{sum_dy_xmu, dy_xmu_sum},
                                std::pair{grad_weight, dy_xmu_sum * invstd}, std::pair{grad_bias, dy_sum}}) {
          if (dst.defined()) {
            dst.copy_(src);
          }
        }
      });
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor batch_norm_backward_elemt(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight_opt, const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
    const at::Tensor& count) {
  const at::Tensor weight = optional_tensor(weight_opt);
  check_same_device("batch_norm_backward_elemt", input, {grad_out, mean, invstd, weight, sum_dy, sum_dy_xmu, count});
  c10::DeviceGuard guard(input.device());
  at::Tensor grad_input = at::empty_like(input);
  launch_on(
      input, "aten::batch_norm_backward_elemt", {grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count},
      {grad_input},
      [grad_out = operand(grad_out), input = operand(input), mean = operand(mean), invstd = operand(invstd),
       weight = operand(weight), sum_dy = operand(sum_dy), sum_dy_xmu = operand(sum_dy_xmu), count = operand(count),
       grad_input = operand(grad_input)] {
        const at::Tensor x = in_compute_dtype(input);
        const at::Tensor total = count.to(mean.scalar_type()).sum();
        const at::Tensor mean_dy = per_channel(sum_dy / total, x);
        const at::Tensor mean_dy_xmu = per_channel(sum_dy_xmu / total, x);
        const at::Tensor inv = per_channel(invstd, x);
        at::Tensor g = (in_compute_dtype(grad_out) - mean_dy - (x - per_channel(mean, x)) * inv * inv * mean_dy_xmu) * inv;
        if (weight.defined()) {
          g = g * per_channel(in_compute_dtype(weight), x);
        }
        grad_input.copy_(g);
      });
  return grad_input;
}

} // namespace

void register_accelerator_ops(KernelRegistrar& kernels) {
  kernels.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  kernels.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  kernels.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  kernels.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
  kernels.impl("_fused_dropout", TORCH_FN(fused_dropout));
  kernels.impl("_masked_scale", TORCH_FN(masked_scale));
  kernels.impl("mm.dtype", TORCH_FN(mm_dtype));
  kernels.impl("mm.dtype_out", TORCH_FN(mm_dtype_out));
  kernels.impl("bmm.dtype", TORCH_FN(bmm_dtype));
  kernels.impl("bmm.dtype_out", TORCH_FN(bmm_dtype_out));
  kernels.impl("addmm.dtype", TORCH_FN(addmm_dtype));
  kernels.impl("addmm.dtype_out", TORCH_FN(addmm_dtype_out));
  kernels.impl("baddbmm.dtype", TORCH_FN(baddbmm_dtype));
  kernels.impl("baddbmm.dtype_out", TORCH_FN(baddbmm_dtype_out));
  kernels.impl("batch_norm_stats", TORCH_FN(batch_norm_stats));
  kernels.impl("batch_norm_elemt", TORCH_FN(batch_norm_elemt));
  kernels.impl("batch_norm_elemt.out", TORCH_FN(batch_norm_elemt_out));
  kernels.impl("batch_norm_gather_stats", TORCH_FN(batch_norm_gather_stats));
  kernels.impl("batch_norm_gather_stats_with_counts", TORCH_FN(batch_norm_gather_stats_with_counts));
  kernels.impl("batch_norm_backward_reduce", TORCH_FN(batch_norm_backward_reduce));
  kernels.impl("batch_norm_backward_elemt", TORCH_FN(batch_norm_backward_elemt));
}

} // namespace openreg
