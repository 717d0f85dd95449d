// torch.profiler's device activity for openreg: a Kineto activity profiler
// (libkineto::IActivityProfiler) registered for PrivateUse1. A session
// starts and stops the runtime's recording (Note [Profiler activities] in
// src/runtime/profiler.rs), forwards PyTorch's per-op correlation ids to it, and at
// the end hands Kineto one activity per kernel, linked to the op that
// launched it, on a row per openreg stream.
//
// The wheel's PyTorch is built with Kineto; its profiler headers declare
// the PrivateUse1 registry only under USE_KINETO.
#define USE_KINETO 1
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h> // CpuTraceBuffer, complete for getTraceBuffer
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

// Row ids of the trace: one per (device, stream), in that order.
int64_t resource_id(int8_t device, int64_t stream) {
  return static_cast<int64_t>(device) * 1000 + stream;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    ffi::profiler_start();
    start_ns_ = ffi::profiler_now_ns();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    ffi::profiler_stop();
    end_ns_ = ffi::profiler_now_ns();
    activities_ = ffi::profiler_take();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, start_ns_, end_ns_);
  }

  // Each kernel is a device activity linked to the CPU op that launched it
  // (its correlation id), which is how key_averages() charges device time
  // to ops.
  void processTrace(
      libkineto::ActivityLogger& logger,
      libkineto::getLinkedActivityCallback linked_activity,
      int64_t /*start_time*/,
      int64_t /*end_time*/) override {
    libkineto::TraceSpan span(start_ns_, end_ns_, "openreg");
    for (const ffi::ProfiledActivity& a : activities_) {
      libkineto::GenericTraceActivity activity(
          span, libkineto::ActivityType::CONCURRENT_KERNEL, std::string(a.name));
      activity.startTime = a.start_ns;
      activity.endTime = a.end_ns;
      activity.device = a.device;
      activity.resource = resource_id(a.device, a.stream);
      activity.id = static_cast<int32_t>(a.correlation);
      activity.linked = a.correlation != 0 ? linked_activity(static_cast<int32_t>(a.correlation)) : nullptr;
      // Typed values: addMetadata formats with fmt, which libtorch does not export.
      activity.addTypedMetadata("device", static_cast<int64_t>(a.device));
      activity.addTypedMetadata("stream", static_cast<int64_t>(a.stream));
      activity.addTypedMetadata("correlation", static_cast<int64_t>(a.correlation));
      activity.log(logger);
    }
    status_ = libkineto::TraceStatus::READY;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return nullptr; // several devices: each stream's row names its device
  }

  // A row per stream that ran something, named after it.
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::map<std::pair<int8_t, int64_t>, bool> streams;
    for (const ffi::ProfiledActivity& a : activities_) {
      streams[{a.device, a.stream}] = true;
    }
    std::vector<libkineto::ResourceInfo> rows;
    for (const auto& [key, unused] : streams) {
      const auto [device, stream] = key;
      rows.push_back(libkineto::ResourceInfo{
          resource_id(device, stream), resource_id(device, stream), device,
          "openreg:" + std::to_string(device) + " stream " + std::to_string(stream)});
    }
    return rows;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return nullptr;
  }

  void pushCorrelationId(uint64_t id) override {
    ffi::profiler_push_correlation(id);
  }

  void popCorrelationId() override {
    ffi::profiler_pop_correlation();
  }

 private:
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  rust::Vec<ffi::ProfiledActivity> activities_;
};

class ActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  // A session only when device activity is asked for (CONCURRENT_KERNEL:
  // ProfilerActivity.PrivateUse1). PyTorch asks for PRIVATEUSE1_RUNTIME with
  // every CPU profile, as it asks for CUDA_RUNTIME (runtime calls are CPU
  // work), the legacy use_device="openreg" profile included; a session there
  // would add the kernels to the device time that profile already measures
  // with device events (Note [Legacy profiler device timing]), counting it
  // twice.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& /*config*/) override {
    if (activity_types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) {
      return std::make_unique<Session>();
    }
    return nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/,
      int64_t /*duration_ms*/,
      const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"openreg"};
  std::set<libkineto::ActivityType> activities_{
      libkineto::ActivityType::CONCURRENT_KERNEL,
      libkineto::ActivityType::PRIVATEUSE1_RUNTIME,
  };
};

} // namespace

void register_profiler() {
  torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
      []() -> std::unique_ptr<libkineto::IActivityProfiler> { return std::make_unique<ActivityProfiler>(); });
}

} // namespace openreg
