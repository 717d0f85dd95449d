// The memory format (strides) of the fresh results openreg's own kernels
// allocate.
//
// Note [Memory format of results]: a result openreg allocates has the
// strides CUDA's kernel gives it, which are CPU's too except where noted:
// - Pointwise ops (openreg's add/sub/mul/div, cpp/ops/elementwise.cpp):
//   TensorIterator's rule, which orders the result's dimensions as its
//   operands' strides order them (TensorIteratorBase::reorder_dimensions
//   and compute_strides in aten/src/ATen/TensorIterator.cpp), so a
//   channels_last operand gives a channels_last result. Operands that are
//   all contiguous give a contiguous result (no work); any other operand
//   asks a TensorIterator built on meta stand-ins for the strides.
// - Convolutions (cpp/ops/convolution.cpp): cuDNN's rule,
//   cudnn_conv_suggest_memory_format in aten/src/ATen/native/ConvUtils.h:
//   channels_last (channels_last_3d) when the input or the weight is, for
//   4-D (5-D) weights, and contiguous for float64, which CUDA runs in NCHW.
//   The output and the input and weight gradients all take it (cuDNN's
//   forward and backward allocate them in that format,
//   aten/src/ATen/native/cudnn/ConvShared.cpp). CPU picks by backend
//   instead (determine_backend_memory_format in
//   aten/src/ATen/native/Convolution.cpp): its slow 2-D kernels keep
//   channels_last for float64 too, and its slow 3-D kernels (taken where
//   oneDNN is not: a batch of one with small kernels) give contiguous
//   results for channels_last_3d inputs and weights.
// - Everything else the fallback computes (Note [Fallback] in fallback.cpp)
//   keeps the strides of CPU's result. A result computed inline is copied
//   to the device with its CPU strides (copy_to_device); a planned result
//   takes the strides of the op's Meta kernel, and where the CPU kernel's
//   results, when the plan is checked, are laid out otherwise (check_plan
//   in meta_results.cpp: the strides of the dims of more than one element,
//   where the result is dense), the plan takes their strides for later
//   calls. The Meta kernels known to lay results out otherwise are never
//   used unchecked (PlanCache's disagreeing ops); any other gives its
//   layout to the one call that used it unchecked, behind queued work. Not mirrored yet: CUDA's pixel_shuffle
//   and channel_shuffle (ATen's composites math_pixel_shuffle and
//   math_channel_shuffle) and max_unpool2d
//   (aten/src/ATen/native/cuda/MaxUnpooling.cu) give contiguous results for
//   channels_last inputs, where CPU's keep channels_last.
#pragma once

#include <initializer_list>

#include <ATen/core/Tensor.h>

namespace openreg {

// A new openreg tensor on the current device for the result of a pointwise
// op of `operands` (broadcast to `sizes`): TensorIterator's strides.
at::Tensor empty_pointwise_result(
    c10::IntArrayRef sizes,
    c10::ScalarType dtype,
    std::initializer_list<std::reference_wrapper<const at::Tensor>> operands);

// The memory format of a convolution's output and gradients on CUDA.
at::MemoryFormat convolution_memory_format(const at::Tensor& input, const at::Tensor& weight);

} // namespace openreg
