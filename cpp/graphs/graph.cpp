// at::GraphImplInterface for openreg: what torch.accelerator.Graph (and
// at::accelerator::Graph in C++) creates for the openreg device. The graph
// itself lives in Rust (src/runtime/graph.rs, Note [Graph capture]); this class
// only forwards, turning Rust errors into c10::Error.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <fstream>

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

class Graph final : public at::GraphImplInterface {
 public:
  explicit Graph(const at::GraphImplArgs& args) : graph_(ffi::new_graph(args.keep_graph)) {}

  // Captures the current stream of the current device. The default mode is
  // CUDA's default, "global" (Note [Capture modes] in src/runtime/graph.rs).
  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    checked([&] {
      ffi::graph_capture_begin(*graph_, ffi::PoolId{pool.first, pool.second}, static_cast<int8_t>(mode));
    });
  }

  void capture_end() override {
    checked([&] { ffi::graph_capture_end(*graph_); });
  }

  void instantiate() override {
    checked([&] { ffi::graph_instantiate(*graph_); });
  }

  // Runs the recorded work on the current stream of the graph's device.
  void replay() override {
    checked([&] { ffi::graph_replay(*graph_); });
  }

  void reset() override {
    checked([&] { ffi::graph_reset(*graph_); });
  }

  at::MempoolId_t pool() const override {
    const ffi::PoolId id = ffi::graph_pool(*graph_);
    return {id.first, id.second};
  }

  // Keeps a Graphviz description of the next capture for debug_dump.
  void enable_debug_mode() override {
    ffi::graph_enable_debug_mode(*graph_);
  }

  void debug_dump(const std::string& path) override {
    const std::string dot(checked([&] { return ffi::graph_debug_dot(*graph_); }));
    std::ofstream out(path);
    TORCH_CHECK(out.is_open(), "debug_dump: cannot open ", path, " for writing");
    out << dot;
    out.close();
    TORCH_CHECK(!out.fail(), "debug_dump: writing ", path, " failed");
  }

 private:
  rust::Box<ffi::Graph> graph_;
};

} // namespace

void register_graphs() {
  // The key has_graph_impl looks up: the backend's upper-case name, known
  // once register_privateuse1_backend ran.
  at::GraphImplRegistry()->Register(
      c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false),
      [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> { return std::make_unique<Graph>(args); });
}

} // namespace openreg
