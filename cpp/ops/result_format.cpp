// See result_format.h (Note [Memory format of results]).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/ops/result_format.h"

#include <algorithm>

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <c10/util/SmallVector.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/device/device_memory.h"

namespace openreg {

at::Tensor empty_pointwise_result(
    c10::IntArrayRef sizes,
    c10::ScalarType dtype,
    std::initializer_list<std::reference_wrapper<const at::Tensor>> operands) {
  const bool all_contiguous =
      std::all_of(operands.begin(), operands.end(), [](const at::Tensor& t) { return t.is_contiguous(); });
  if (all_contiguous) {
    return empty_on_current_device(sizes, dtype);
  }
  // Meta stand-ins of one dtype (the strides do not depend on it); the
  // iterator allocates its output with the strides it chose.
  c10::SmallVector<at::Tensor, 4> stand_ins;
  for (const at::Tensor& t : operands) {
    stand_ins.emplace_back(at::detail::empty_strided_meta(t.sizes(), t.strides(), dtype));
  }
  at::TensorIteratorConfig config;
  config.add_owned_output(at::Tensor());
  for (const at::Tensor& stand_in : stand_ins) {
    config.add_const_input(stand_in);
  }
  const at::TensorIterator iterator = config.build();
  const at::TensorBase& planned = iterator.output(0);
  TORCH_INTERNAL_ASSERT(planned.sizes() == sizes, "pointwise result: broadcast sizes ", planned.sizes(), " != ", sizes);
  return at::detail::empty_strided_generic(
      sizes, planned.strides(), device_memory_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

at::MemoryFormat convolution_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  if (input.scalar_type() == at::kDouble || weight.scalar_type() == at::kDouble) {
    return at::MemoryFormat::Contiguous;
  }
  const at::MemoryFormat input_format = input.suggest_memory_format();
  const at::MemoryFormat weight_format = weight.suggest_memory_format();
  for (const auto& [dims, format] : {std::pair{4, at::MemoryFormat::ChannelsLast},
                                    std::pair{5, at::MemoryFormat::ChannelsLast3d}}) {
    if (weight.dim() == dims && (input_format == format || weight_format == format)) {
      return format;
    }
  }
  return at::MemoryFormat::Contiguous;
}

} // namespace openreg
