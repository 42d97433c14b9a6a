// Work shared among ATen's intra-op threads a task at a time.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace torch_convgrad {

// Runs fn(task) for every task in [0, count) on ATen's intra-op threads,
// each thread taking the next task not yet taken whenever it finishes one.
// at::parallel_for hands each thread a fixed share instead, so a call lasts
// as long as its slowest thread: on a shared machine one core often runs
// slower than the other (a 2-vCPU VM, 2026-12-05: over 300 calls of
// MobileNetV2's depthwise layer, one thread's half took a median 1.48 times
// the other's, in another 300 calls 1.04). A task's result must not depend
// on the thread that runs it, nor on the order tasks run in: each task writes
// its own output, so results stay deterministic. at::parallel_for is inline:
// it runs in parallel only where the calling file is compiled with -fopenmp.
template <typename Fn>
void run_tasks(int64_t count, const Fn& fn) {
  if (count <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    // One index a thread; run serially (nested parallelism), the first index takes every task.
    for (int64_t index = begin; index < end; ++index)
      for (int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < count;
           task = next.fetch_add(1, std::memory_order_relaxed))
        fn(task);
  });
}

}  // namespace torch_convgrad
