// Graph capture and replay from C++, two ways a libtorch program can:
//  - PyTorch's own API, at::accelerator::Graph, which creates openreg's
//    at::GraphImplInterface (cpp/graphs/graph.cpp);
//  - the C ABI of openreg.h (orStreamBeginCapture ... orGraphLaunch), as a
//    custom kernel or a program without PyTorch's graph API would.
// Exit status 0 iff every check passed.
#include <ATen/ATen.h>
#include <ATen/accelerator/Graph.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <openreg.h>

#include "expect.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace {

using openreg_test::failed;

const c10::Device kDev0(c10::DeviceType::PrivateUse1, 0);

const c10::impl::DeviceGuardImplInterface& impl() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

bool all_equal(const at::Tensor& t, float value) {
  return at::equal(t.cpu(), at::full(t.sizes(), value));
}

// Capture records without running; replay runs on the data of the moment.
void test_accelerator_graph() {
  std::printf("[graphs] at::accelerator::Graph\n");
  at::Tensor x = at::ones({1024}, at::TensorOptions().device(kDev0));
  impl().synchronizeDevice(0);
  const c10::Stream side = impl().getStreamFromGlobalPool(kDev0);
  at::accelerator::Graph graph;
  at::Tensor y;
  {
    c10::StreamGuard on_side(side);
    graph.capture_begin();
    EXPECT(impl().isStreamCapturing(side));
    x.add_(1);
    y = x * 3;
    graph.capture_end();
  }
  EXPECT(!impl().isStreamCapturing(side));
  EXPECT(all_equal(x, 1)); // captured, not run
  graph.replay();
  EXPECT(all_equal(x, 2) && all_equal(y, 6));
  x.fill_(10);
  graph.replay();
  EXPECT(all_equal(x, 11) && all_equal(y, 33));
  graph.reset();
  bool replay_failed = false;
  try {
    graph.replay();
  } catch (const c10::Error& e) {
    replay_failed = std::string(e.what()).find("without a successful capture") != std::string::npos;
  }
  EXPECT(replay_failed);
}

void count_up(void* counter) {
  static_cast<std::atomic<int>*>(counter)->fetch_add(1);
}

// The C ABI: a host function captured runs once per launch; a host wait on
// the capturing stream fails without ending the capture.
void test_c_abi() {
  std::printf("[graphs] C ABI capture, instantiate, launch\n");
  orStream_t stream = nullptr;
  EXPECT(orStreamGetFromPool(0, 0, &stream) == orSuccess);
  std::atomic<int> counter{0};
  EXPECT(orStreamBeginCapture(stream, orStreamCaptureModeThreadLocal) == orSuccess);
  int capturing = 0;
  EXPECT(orStreamIsCapturing(stream, &capturing) == orSuccess && capturing == 1);
  EXPECT(orStreamBeginCapture(stream, orStreamCaptureModeGlobal) == orErrorStreamCapture); // nested
  for (int i = 0; i < 3; ++i) {
    EXPECT(orLaunchHostFunc(stream, count_up, &counter) == orSuccess);
  }
  EXPECT(orStreamSynchronize(stream) == orErrorStreamCapture);
  orGraph_t graph = nullptr;
  // The illegal synchronize invalidated the capture: it ends with an error.
  EXPECT(orStreamEndCapture(stream, &graph) == orErrorStreamCapture && graph == nullptr);
  EXPECT(orStreamIsCapturing(stream, &capturing) == orSuccess && capturing == 0);
  EXPECT(counter.load() == 0);

  EXPECT(orStreamBeginCapture(stream, orStreamCaptureModeThreadLocal) == orSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT(orLaunchHostFunc(stream, count_up, &counter) == orSuccess);
  }
  EXPECT(orStreamEndCapture(stream, &graph) == orSuccess && graph != nullptr);
  size_t nodes = 0;
  EXPECT(orGraphGetNodeCount(graph, &nodes) == orSuccess && nodes == 3);
  EXPECT(counter.load() == 0);
  orGraphExec_t exec = nullptr;
  EXPECT(orGraphInstantiate(&exec, graph) == orSuccess);
  for (int i = 0; i < 4; ++i) {
    EXPECT(orGraphLaunch(exec, stream) == orSuccess);
  }
  EXPECT(orStreamSynchronize(stream) == orSuccess);
  EXPECT(counter.load() == 12);
  EXPECT(orGraphExecDestroy(exec) == orSuccess);
  EXPECT(orGraphDestroy(graph) == orSuccess);
  EXPECT(orGraphDestroy(graph) == orErrorInvalidHandle);
  EXPECT(orGraphLaunch(exec, stream) == orErrorInvalidHandle);
  uint64_t first = 0, second = 0, again = 0;
  EXPECT(orGraphPoolHandle(&first, &second) == orSuccess && first == 0 && second > 0);
  EXPECT(orGraphPoolHandle(&first, &again) == orSuccess && again != second);
}

} // namespace

int main() {
  try {
    test_accelerator_graph();
    test_c_abi();
  } catch (const std::exception& e) {
    std::printf("  FAILED: unexpected exception: %s\n", e.what());
    ++failed;
  }
  std::printf("%s (%d failed checks)\n", failed == 0 ? "all graph checks passed" : "FAILED", failed);
  return failed == 0 ? 0 : 1;
}
