/* sparsec's CUDA emulation: the generated .cu text, compiled for the CPU by a C++20
 * compiler with this header in front of it. Blocks run on OpenMP threads; the threads of
 * a block run one after another, or, when the kernel uses warp shuffles, as fibers
 * (ucontext) that meet at each shuffle like the lanes of a warp. Atomics are
 * compare-and-swap loops on the value's bits. Only what sparsec's kernels use is
 * emulated; no C++ library headers, so the emulation builds in a fraction of a second. */
#include <stdlib.h>
#include <ucontext.h>

/* the CUDA math API's functions the language's functions print as (sparsec/frontend/
   functions.py), overloaded on float and double as CUDA's are, from compiler builtins */
#define SC_MATH1(fn) \
  static inline float fn(float x) { return __builtin_##fn##f(x); } \
  static inline double fn(double x) { return __builtin_##fn(x); }
#define SC_MATH2(fn) \
  static inline float fn(float x, float y) { return __builtin_##fn##f(x, y); } \
  static inline double fn(double x, double y) { return __builtin_##fn(x, y); }
SC_MATH1(fabs) SC_MATH1(sqrt) SC_MATH1(exp) SC_MATH1(log) SC_MATH1(sin) SC_MATH1(cos)
SC_MATH1(tanh) SC_MATH2(fmax) SC_MATH2(fmin) SC_MATH2(pow)
#undef SC_MATH1
#undef SC_MATH2

struct sc_dim3 {
  unsigned x = 1, y = 1, z = 1;
};
static thread_local sc_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict

template <class T, class Bits>
inline T sc_atomic_add(T* address, T value) {
  Bits* cell = reinterpret_cast<Bits*>(address);
  Bits seen = __atomic_load_n(cell, __ATOMIC_RELAXED);
  for (;;) {
    T old;
    __builtin_memcpy(&old, &seen, sizeof(T));
    T sum = old + value;
    Bits next;
    __builtin_memcpy(&next, &sum, sizeof(T));
    if (__atomic_compare_exchange_n(cell, &seen, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return old;
  }
}
inline double atomicAdd(double* address, double value) {
  return sc_atomic_add<double, unsigned long long>(address, value);
}
inline float atomicAdd(float* address, float value) {
  return sc_atomic_add<float, unsigned int>(address, value);
}

/* compare-and-swap and the bit casts, for the template's semiring atomics (min, max, or) */
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return compare;  // the value seen: `compare` itself on success
}
inline unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return compare;
}
template <class To, class From>
inline To sc_bits(From x) {
  To out;
  __builtin_memcpy(&out, &x, sizeof(To));
  return out;
}
inline long long __double_as_longlong(double x) { return sc_bits<long long>(x); }
inline double __longlong_as_double(long long x) { return sc_bits<double>(x); }
inline unsigned int __float_as_uint(float x) { return sc_bits<unsigned int>(x); }
inline float __uint_as_float(unsigned int x) { return sc_bits<float>(x); }
/* bit intrinsics: the first set bit (1-based, 0 when none) and the set bits' count */
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }

namespace sc_emu {

constexpr long kStack = 128 * 1024;

struct Block {
  int threads = 0;
  int current = 0;
  ucontext_t scheduler;
  ucontext_t* contexts = nullptr;
  char* done = nullptr;
  /* a lane's shuffled value, as its bits (any type of at most 8 bytes, exactly) */
  unsigned long long* slots = nullptr;
  unsigned long long* results = nullptr;
  int* arrived = nullptr;
  int* generation = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};

static thread_local Block* running = nullptr;
static thread_local char* stacks = nullptr;
static thread_local long stacks_size = 0;

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
  int warps = (threads + 31) / 32;
  b.contexts = static_cast<ucontext_t*>(calloc(threads, sizeof(ucontext_t)));
  b.done = static_cast<char*>(calloc(threads, 1));
  b.slots = static_cast<unsigned long long*>(calloc(threads, sizeof(unsigned long long)));
  b.results = static_cast<unsigned long long*>(calloc(threads, sizeof(unsigned long long)));
  // a shuffle's meeting is kept at the first lane of its mask (a warp or a lane group)
  b.arrived = static_cast<int*>(calloc(warps * 32, sizeof(int)));
  b.generation = static_cast<int*>(calloc(warps * 32, sizeof(int)));
  if (stacks_size < kStack * threads) {
    free(stacks);
    stacks_size = kStack * threads;
    stacks = static_cast<char*>(malloc(stacks_size));
  }
  if (!b.contexts || !b.done || !b.slots || !b.results || !b.arrived || !b.generation || !stacks)
    abort();  // the emulation cannot run without memory for its fibers
  for (int t = 0; t < threads; t++) {
    getcontext(&b.contexts[t]);
    b.contexts[t].uc_stack.ss_sp = stacks + kStack * t;
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
  free(b.contexts);
  free(b.done);
  free(b.slots);
  free(b.results);
  free(b.arrived);
  free(b.generation);
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

namespace sc_emu {
/* the lanes named in `mask` (those of the warp that exist) deposit their values and wait
   for each other (fiber switches); then each reads the deposited values, as the hardware
   shuffles do. A lane missing from its own mask, or a named lane that exits before the
   meeting (a hang or undefined on a GPU), aborts. Returns the lanes that met. */
inline unsigned meet(unsigned mask, unsigned long long value) {
  Block* b = running;
  int t = b->current, w = t / 32, lane = t % 32;
  int size = b->threads - w * 32 < 32 ? b->threads - w * 32 : 32;
  unsigned present = size == 32 ? 0xffffffffu : (1u << size) - 1u;
  unsigned members = mask & present;
  if (!((members >> lane) & 1u)) abort();
  int at = w * 32 + __builtin_ctz(members);
  int count = __builtin_popcount(members);
  b->slots[t] = value;
  int gen = b->generation[at];
  if (++b->arrived[at] == count) {
    b->arrived[at] = 0;
    for (int l = 0; l < 32; l++)
      if ((members >> l) & 1u) b->results[w * 32 + l] = b->slots[w * 32 + l];
    b->generation[at]++;
  } else {
    while (b->generation[at] == gen) {
      for (int l = 0; l < 32; l++)
        if (((members >> l) & 1u) && b->done[w * 32 + l]) abort();
      yield();
    }
  }
  return members;
}
}  // namespace sc_emu

/* the value `delta` lanes up within this lane's segment of `width` lanes; a source past
   the segment, or outside the mask, gives the lane its own value */
template <class T>
inline T __shfl_down_sync(unsigned mask, T value, int delta, int width = 32) {
  unsigned long long bits = 0;
  __builtin_memcpy(&bits, &value, sizeof(T));
  unsigned members = sc_emu::meet(mask, bits);
  int t = sc_emu::running->current, lane = t % 32, source = lane + delta;
  int end = (lane & ~(width - 1)) + width;
  if (source >= end || source >= 32 || !((members >> source) & 1u)) return value;
  T got;
  __builtin_memcpy(&got, &sc_emu::running->results[t - lane + source], sizeof(T));
  return got;
}
/* the value `delta` lanes down within this lane's segment, likewise */
template <class T>
inline T __shfl_up_sync(unsigned mask, T value, int delta, int width = 32) {
  unsigned long long bits = 0;
  __builtin_memcpy(&bits, &value, sizeof(T));
  unsigned members = sc_emu::meet(mask, bits);
  int t = sc_emu::running->current, lane = t % 32, source = lane - delta;
  if (source < (lane & ~(width - 1)) || !((members >> source) & 1u)) return value;
  T got;
  __builtin_memcpy(&got, &sc_emu::running->results[t - lane + source], sizeof(T));
  return got;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
