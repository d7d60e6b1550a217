/* sparsec's CUDA emulation: the generated .cu text, compiled for the CPU by a C++20
 * compiler with this header in front of it. Blocks run on OpenMP threads; the threads of
 * a block run one after another, or, when the kernel uses warp shuffles, as fibers
 * (ucontext) that meet at each shuffle like the lanes of a warp. Atomics are
 * std::atomic_ref. Only what sparsec's kernels use is emulated. */
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <ucontext.h>
#include <vector>

struct sc_dim3 {
  unsigned x = 1, y = 1, z = 1;
};
static thread_local sc_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict

template <class T>
inline T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}

namespace sc_emu {

constexpr std::size_t kStack = 128 * 1024;

struct Block {
  int threads = 0;
  int current = 0;
  ucontext_t scheduler;
  std::vector<ucontext_t> contexts;
  std::vector<char> done;
  std::vector<double> slots, results;
  std::vector<int> arrived, generation;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};

static thread_local Block* running = nullptr;
static thread_local std::vector<char> stacks;

inline void yield() {
  Block* b = running;
  swapcontext(&b->contexts[b->current], &b->scheduler);
}

inline void entry() {
  Block* b = running;
  b->body(b->arg);
  b->done[b->current] = 1;  // uc_link returns to the scheduler
}

inline void run_fibers(int threads, void (*body)(void*), void* arg) {
  Block b;
  b.threads = threads;
  b.body = body;
  b.arg = arg;
  b.contexts.resize(threads);
  b.done.assign(threads, 0);
  b.slots.assign(threads, 0.0);
  b.results.assign(threads, 0.0);
  int warps = (threads + 31) / 32;
  b.arrived.assign(warps, 0);
  b.generation.assign(warps, 0);
  if (stacks.size() < kStack * threads) stacks.resize(kStack * threads);
  for (int t = 0; t < threads; t++) {
    getcontext(&b.contexts[t]);
    b.contexts[t].uc_stack.ss_sp = stacks.data() + kStack * t;
    b.contexts[t].uc_stack.ss_size = kStack;
    b.contexts[t].uc_link = &b.scheduler;
    makecontext(&b.contexts[t], entry, 0);
  }
  Block* outer = running;
  running = &b;
  int alive = threads;
  while (alive > 0) {
    for (int t = 0; t < threads; t++) {
      if (b.done[t]) continue;
      b.current = t;
      threadIdx.x = t;
      swapcontext(&b.scheduler, &b.contexts[t]);
      if (b.done[t]) alive--;
    }
  }
  running = outer;
}

template <class F>
void launch(long long grid, int block, bool fibers, F& kernel) {
#pragma omp parallel for schedule(dynamic, 1)
  for (long long g = 0; g < grid; g++) {
    gridDim.x = (unsigned)grid;
    blockDim.x = (unsigned)block;
    blockIdx.x = (unsigned)g;
    if (fibers) {
      run_fibers(block, [](void* k) { (*static_cast<F*>(k))(); }, &kernel);
    } else {
      for (int t = 0; t < block; t++) {
        threadIdx.x = t;
        kernel();
      }
    }
  }
}

}  // namespace sc_emu

/* every lane of the warp deposits its value and waits for the others (a fiber switch),
   then reads the value `delta` lanes up, as the hardware shuffle does */
template <class T>
inline T __shfl_down_sync(unsigned, T value, int delta) {
  sc_emu::Block* b = sc_emu::running;
  int t = b->current, w = t / 32, lane = t % 32;
  int size = b->threads - w * 32 < 32 ? b->threads - w * 32 : 32;
  b->slots[t] = (double)value;
  int gen = b->generation[w];
  if (++b->arrived[w] == size) {
    b->arrived[w] = 0;
    for (int l = 0; l < size; l++) b->results[w * 32 + l] = b->slots[w * 32 + l];
    b->generation[w]++;
  } else {
    while (b->generation[w] == gen) sc_emu::yield();
  }
  int source = lane + delta;
  return source < size ? (T)b->results[w * 32 + source] : value;
}
