// See meta_kernels.h (Note [C++ Meta kernels]).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/ops/meta_kernels.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include "torch_openreg/cpp/generated/meta_kernels_table.h"

namespace openreg {

namespace {

const std::unordered_multimap<std::string, const CxxMetaKernel*>& kernels_by_operator() {
  static const std::vector<CxxMetaKernel> kernels = generated_cxx_meta_kernels();
  static const std::unordered_multimap<std::string, const CxxMetaKernel*> by_operator = [] {
    std::unordered_multimap<std::string, const CxxMetaKernel*> map;
    for (const CxxMetaKernel& kernel : kernels) {
      map.emplace(kernel.op, &kernel);
    }
    return map;
  }();
  return by_operator;
}

} // namespace

void index_cxx_meta_kernels() {
  kernels_by_operator();
}

const c10::KernelFunction* cxx_meta_kernel_for(const c10::OperatorHandle& op) {
  const auto& by_operator = kernels_by_operator();
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, const c10::KernelFunction*> resolved;

  const c10::FunctionSchema& schema = op.schema();
  std::lock_guard<std::mutex> lock(mutex);
  auto [found, inserted] = resolved.try_emplace(&schema, nullptr);
  if (inserted) {
    auto [begin, end] = by_operator.equal_range(schema.name());
    for (auto it = begin; it != end; ++it) {
      if (!c10::findSchemaDifferences(it->second->infer_schema(), schema)) {
        found->second = &it->second->kernel;
        break;
      }
    }
  }
  return found->second;
}

} // namespace openreg
