// The one place that picks an algorithm, and the override that forces one.
//
// The override is process-wide, like torch.backends flags. It is read from
// TORCH_CONVGRAD_ALGORITHM when the library loads and set at run time through
// the C functions below (torch_convgrad.use_algorithm calls them with ctypes,
// since the extension module itself exposes no Python API).
#include "select.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace torch_convgrad {
namespace {

// In the order ties are broken.
const Algorithm* const kAlgorithms[] = {&kAtenAlgorithm, &kGemmAlgorithm, &kDepthwiseAlgorithm,
                                        &kAtenChannelsLastAlgorithm, &kDirectAlgorithm,
                                        &kBrgemmAlgorithm, &kAmxPlanesAlgorithm, &kAmxDepthwiseAlgorithm,
                                        &kMatmulAlgorithm, &kAtenChannelsFirstAlgorithm};

const Algorithm* find_algorithm(const char* name) {
  for (const Algorithm* algorithm : kAlgorithms)
    if (std::strcmp(algorithm->name, name) == 0) return algorithm;
  return nullptr;
}

std::string algorithm_names() {
  std::string names;
  for (const Algorithm* algorithm : kAlgorithms) names += (names.empty() ? "" : ",") + std::string(algorithm->name);
  return names;
}

// An unknown name in the environment is reported by the first op call, as a
// Python exception, rather than at import.
const char* const kEnvironmentVariable = "TORCH_CONVGRAD_ALGORITHM";
const char* const forced_from_environment = std::getenv(kEnvironmentVariable);
std::atomic<const Algorithm*> forced{forced_from_environment && *forced_from_environment
                                         ? find_algorithm(forced_from_environment)
                                         : nullptr};
std::atomic<bool> environment_checked{false};

thread_local const Algorithm* last_algorithm = nullptr;

}  // namespace

const Algorithm& select_algorithm(const Problem& problem) {
  if (!environment_checked.load(std::memory_order_relaxed)) {
    TORCH_CHECK_VALUE(!forced_from_environment || !*forced_from_environment || find_algorithm(forced_from_environment),
                      kEnvironmentVariable, ": expected one of ", algorithm_names(), ", got '",
                      forced_from_environment, "'");
    environment_checked = true;
  }
  const Algorithm* choice = forced.load();
  if (choice && choice->supports(problem)) return *choice;
  const Geometry geometry = geometry_of(problem);
  choice = nullptr;
  double best = 0;
  for (const Algorithm* algorithm : kAlgorithms) {
    if (!algorithm->supports(problem)) continue;
    const double cost = algorithm->cost(problem, geometry);
    if (!choice || cost < best) {
      choice = algorithm;
      best = cost;
    }
  }
  return *choice;  // "aten" supports every problem
}

void record_algorithm(const Algorithm* algorithm) { last_algorithm = algorithm; }

}  // namespace torch_convgrad

extern "C" {
// Forces the named algorithm (nullptr or "" lifts the override). Returns 0, or
// -1 for an unknown name.
int torch_convgrad_force_algorithm(const char* name) {
  using namespace torch_convgrad;
  if (name == nullptr || *name == '\0') {
    forced = nullptr;
    return 0;
  }
  const Algorithm* algorithm = find_algorithm(name);
  if (algorithm == nullptr) return -1;
  forced = algorithm;
  return 0;
}

// The forced algorithm's name, or "".
const char* torch_convgrad_forced_algorithm() {
  const torch_convgrad::Algorithm* algorithm = torch_convgrad::forced.load();
  return algorithm ? algorithm->name : "";
}

// The algorithm that ran last in this thread, or "" when none was needed.
const char* torch_convgrad_last_algorithm() {
  return torch_convgrad::last_algorithm ? torch_convgrad::last_algorithm->name : "";
}

// The CPU calibration the cost models use (cpu_calibration_name()).
const char* torch_convgrad_cpu_calibration() { return torch_convgrad::cpu_calibration_name(); }

// Every algorithm's name, comma-separated.
const char* torch_convgrad_algorithm_names() {
  static const std::string names = torch_convgrad::algorithm_names();
  return names.c_str();
}
}
