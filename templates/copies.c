/* sparsec's copies of dense operands (`sparsec.runtime.copies`): a 2-D array read at any
   element strides (rs between rows, cs between columns), written C-ordered into `out`, on
   `threads` OpenMP threads. Values are copied as bits: any dtype of the width.

   The general copy works in bands: each thread copies the same rows of every band of
   columns; a band is one cache line of an output row, so its reads follow BAND source
   streams and its writes fill whole lines (numpy's copy of a transpose reads a column of
   the source for every output row).

   A source that runs along the output's rows (rs == 1: the transpose of a C-ordered array,
   as SparseLinear's tokens-first activations read as Xt(i, t)) of 4- or 8-byte values is
   copied in blocks instead: one cache line of source rows (16 or 8 of them) by one vector
   of columns, each block loaded as whole vectors along the source's rows, transposed in
   registers and stored as whole vectors along the output's. Every source line is then read
   once, and every load and store is a vector. Unless the output's rows are a multiple of
   2 KB apart: then a block's rows fall into one or two sets of the L1 data cache (its ways
   are 4 KB on x86 cores), and the bands, which finish each output line before the next,
   are faster (docs/decisions.md, "Transposed operands copied in register blocks"). */
#include <stdint.h>

#define SC_COPY2D_BANDS(name, T, BAND)                                                    \
  static void name(const T* restrict in, T* restrict out, int64_t rows, int64_t cols,     \
                   int64_t rs, int64_t cs, int threads) {                                 \
    _Pragma("omp parallel num_threads(threads) if(threads > 1)")                          \
    for (int64_t cb = 0; cb < cols; cb += BAND) {                                         \
      int64_t ce = cb + BAND < cols ? cb + BAND : cols;                                   \
      _Pragma("omp for schedule(static) nowait")                                          \
      for (int64_t r = 0; r < rows; r++) {                                                \
        for (int64_t c = cb; c < ce; c++) out[r * cols + c] = in[r * rs + c * cs];        \
      }                                                                                   \
    }                                                                                     \
  }

SC_COPY2D_BANDS(sc_bands_2, uint16_t, 32)
SC_COPY2D_BANDS(sc_bands_4, uint32_t, 16)
SC_COPY2D_BANDS(sc_bands_8, uint64_t, 8)

/* the blocked transpose needs __builtin_shufflevector (clang, GCC 12 and later); without
   it every copy takes the bands */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SC_BLOCKS 1
/* 32-byte vectors of lanes; the `u` forms load and store at any element boundary */
typedef uint32_t sc_w8 __attribute__((vector_size(32)));
typedef uint32_t sc_w8u __attribute__((vector_size(32), aligned(4)));
typedef uint64_t sc_d4 __attribute__((vector_size(32)));
typedef uint64_t sc_d4u __attribute__((vector_size(32), aligned(8)));

/* out(r, c) = in(r + c * cs) for r, c in 0..7: 8 source columns (8 lanes each, along r)
   become 8 output rows (along c) by three rounds of two-vector shuffles */
static inline void sc_block8(const uint32_t* in, uint32_t* out, int64_t cs, int64_t cols) {
  sc_w8 a[8], t[8], u[8];
  for (int k = 0; k < 8; k++) a[k] = *(const sc_w8u*)(in + k * cs);
  for (int k = 0; k < 8; k += 2) {  /* pairs of lanes of columns k, k+1 */
    t[k] = __builtin_shufflevector(a[k], a[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(a[k], a[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {  /* quads: columns k..k+3 of two rows per half */
    u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int k = 0; k < 4; k++) {  /* row k from the low halves, row k + 4 from the high */
    *(sc_w8u*)(out + k * cols) = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    *(sc_w8u*)(out + (k + 4) * cols) =
        __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/* the same for 8-byte values: 4 source columns of 4 lanes become 4 output rows */
static inline void sc_block4(const uint64_t* in, uint64_t* out, int64_t cs, int64_t cols) {
  sc_d4 a0 = *(const sc_d4u*)in, a1 = *(const sc_d4u*)(in + cs);
  sc_d4 a2 = *(const sc_d4u*)(in + 2 * cs), a3 = *(const sc_d4u*)(in + 3 * cs);
  sc_d4 t0 = __builtin_shufflevector(a0, a1, 0, 4, 2, 6);
  sc_d4 t1 = __builtin_shufflevector(a0, a1, 1, 5, 3, 7);
  sc_d4 t2 = __builtin_shufflevector(a2, a3, 0, 4, 2, 6);
  sc_d4 t3 = __builtin_shufflevector(a2, a3, 1, 5, 3, 7);
  *(sc_d4u*)out = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  *(sc_d4u*)(out + cols) = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  *(sc_d4u*)(out + 2 * cols) = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  *(sc_d4u*)(out + 3 * cols) = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}

/* blocks of LINE output rows (one cache line of each source column) by B columns, B x B
   register transposes inside; the rows past the last whole block and the columns past the
   last whole vector are copied one value at a time */
#define SC_COPY2D_BLOCKS(name, T, B, LINE, BLOCK)                                          \
  static void name(const T* restrict in, T* restrict out, int64_t rows, int64_t cols,      \
                   int64_t cs, int threads) {                                              \
    int64_t rt = rows / LINE * LINE, ct = cols / B * B;                                    \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if(threads > 1)")      \
    for (int64_t r0 = 0; r0 < rt; r0 += LINE) {                                            \
      for (int64_t c0 = 0; c0 < ct; c0 += B)                                               \
        for (int64_t r = r0; r < r0 + LINE; r += B) BLOCK(in + r + c0 * cs, out + r * cols + c0, cs, cols); \
      for (int64_t r = r0; r < r0 + LINE; r++)                                             \
        for (int64_t c = ct; c < cols; c++) out[r * cols + c] = in[r + c * cs];            \
    }                                                                                      \
    for (int64_t r = rt; r < rows; r++)                                                    \
      for (int64_t c = 0; c < cols; c++) out[r * cols + c] = in[r + c * cs];               \
  }

SC_COPY2D_BLOCKS(sc_blocks_4, uint32_t, 8, 16, sc_block8)
SC_COPY2D_BLOCKS(sc_blocks_8, uint64_t, 4, 8, sc_block4)

/* whether a copy of `size`-byte values takes the register blocks: a source along the
   output's rows, and output rows not a multiple of 2 KB apart (see the top) */
static inline int sc_in_blocks(int64_t rs, int64_t cols, int64_t size) {
  return rs == 1 && cols * size % 2048 != 0;
}
#else
#define SC_BLOCKS 0
#endif

void sparsec_copy2d_2(const uint16_t* restrict in, uint16_t* restrict out, int64_t rows,
                      int64_t cols, int64_t rs, int64_t cs, int threads) {
  sc_bands_2(in, out, rows, cols, rs, cs, threads);
}

void sparsec_copy2d_4(const uint32_t* restrict in, uint32_t* restrict out, int64_t rows,
                      int64_t cols, int64_t rs, int64_t cs, int threads) {
#if SC_BLOCKS
  if (sc_in_blocks(rs, cols, 4)) {
    sc_blocks_4(in, out, rows, cols, cs, threads);
    return;
  }
#endif
  sc_bands_4(in, out, rows, cols, rs, cs, threads);
}

void sparsec_copy2d_8(const uint64_t* restrict in, uint64_t* restrict out, int64_t rows,
                      int64_t cols, int64_t rs, int64_t cs, int threads) {
#if SC_BLOCKS
  if (sc_in_blocks(rs, cols, 8)) {
    sc_blocks_8(in, out, rows, cols, cs, threads);
    return;
  }
#endif
  sc_bands_8(in, out, rows, cols, rs, cs, threads);
}

/* ---------------------------------------------------------------- column panels
   A kernel's call in column panels made in one C call (`Executable.run_panels`): for each
   panel, each carrier's panel is packed into a worker's buffer (the copies above), the
   kernel's packed entry runs on it, and its output panel is copied into place; the time
   spent inside the kernel is reported. `args` are the kernel's ABI arguments for a panel
   of this call's width (int64 each, arrays by address); the driver puts each worker's
   buffers into the carriers' and the output's slots. `carriers` holds six values per
   carrier: its slot, its source's address, rows, row and column strides (in values), and
   its values' bytes (4 or 8, copied as bits). Panels start at `first`, `width` apart,
   `count` of them; `out` has `out_rows` rows of `n` values of `out_size` bytes, and each
   output panel is `out_rows` x `width`. `buffers` holds each worker's carrier buffers then
   its output buffer. Panels run on `workers` OpenMP threads, each packing and calling the
   kernel with `inner` threads (`inner` is 1 where `workers` > 1). With `poison` (the test
   mode), each output panel is first filled with the `out_size` bytes of `fill`. Returns the first
   nonzero status of a kernel call (the panels left are not run), else 0; `kernel_ns`:
   the most any worker spent inside the kernel. */
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef int (*sc_packed_kernel)(const void*);

static int64_t sc_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* a panel's copy (its pack, its output's placing) is shared among the call's threads
   from this many bytes */
#define SC_SHARED_COPY_BYTES ((int64_t)1 << 18)

static void sc_pack_panel(const char* src, char* to, int64_t rows, int64_t cols, int64_t rs,
                          int64_t cs, int64_t size, int threads) {
  if (cs == 1) {  /* rows of the source are rows of the panel */
    #pragma omp parallel for schedule(static) num_threads(threads) if(threads > 1 && rows * cols * size >= SC_SHARED_COPY_BYTES)
    for (int64_t r = 0; r < rows; r++) memcpy(to + r * cols * size, src + r * rs * size, cols * size);
  } else if (size == 4) {
    sparsec_copy2d_4((const uint32_t*)src, (uint32_t*)to, rows, cols, rs, cs, threads);
  } else {
    sparsec_copy2d_8((const uint64_t*)src, (uint64_t*)to, rows, cols, rs, cs, threads);
  }
}

#define SC_MAX_ARGS 64
#define SC_MAX_WORKERS 256

/* what every panel of one driver call shares */
typedef struct {
  sc_packed_kernel kernel;
  const int64_t* args;
  int64_t nargs;
  const int64_t* carriers;
  int64_t ncarriers, out_slot, out, out_rows, n, out_size, first, width;
  const int64_t* buffers;
  int inner, poison;
  int64_t fill;
} sc_panels;

/* panel p on worker w's buffers: its status; the time inside the kernel added to spent */
static int sc_one_panel(const sc_panels* c, int64_t p, int w, int64_t* spent) {
  const int64_t* own = c->buffers + w * (c->ncarriers + 1);
  int64_t a[SC_MAX_ARGS];
  memcpy(a, c->args, c->nargs * sizeof *a);
  int64_t start = c->first + p * c->width;
  for (int64_t k = 0; k < c->ncarriers; k++) {
    const int64_t* d = c->carriers + 6 * k;
    const char* src = (const char*)(uintptr_t)d[1] + start * d[4] * d[5];
    sc_pack_panel(src, (char*)(uintptr_t)own[k], d[2], c->width, d[3], d[4], d[5], c->inner);
    a[d[0]] = own[k];
  }
  a[c->out_slot] = own[c->ncarriers];
  if (c->poison) {  /* test mode: an element the kernel fails to write shows */
    char* o = (char*)(uintptr_t)own[c->ncarriers];
    for (int64_t e = 0; e < c->out_rows * c->width; e++) memcpy(o + e * c->out_size, &c->fill, c->out_size);
  }
  int64_t began = sc_now_ns();
  int got = c->kernel(a);
  *spent += sc_now_ns() - began;
  if (got) return got;
  const char* panel = (const char*)(uintptr_t)own[c->ncarriers];
  char* to = (char*)(uintptr_t)c->out + start * c->out_size;
  int64_t row = c->width * c->out_size;
  #pragma omp parallel for schedule(static) num_threads(c->inner) if(c->inner > 1 && c->out_rows * row >= SC_SHARED_COPY_BYTES)
  for (int64_t r = 0; r < c->out_rows; r++) memcpy(to + r * c->n * c->out_size, panel + r * row, row);
  return 0;
}

int sparsec_panels(int64_t fn, const int64_t* args, int64_t nargs, const int64_t* carriers,
                   int64_t ncarriers, int64_t out_slot, int64_t out, int64_t out_rows,
                   int64_t n, int64_t out_size, int64_t first, int64_t width, int64_t count,
                   const int64_t* buffers, int workers, int inner, int poison, int64_t fill,
                   int64_t* kernel_ns) {
  sc_panels c = {(sc_packed_kernel)(uintptr_t)fn, args, nargs, carriers, ncarriers, out_slot,
                 out, out_rows, n, out_size, first, width, buffers, inner, poison, fill};
  int status = 0;
  int64_t spent[SC_MAX_WORKERS] = {0};
  if (nargs > SC_MAX_ARGS || workers > SC_MAX_WORKERS || workers < 1) return -1;
  if (workers == 1) {
    /* no parallel region around the kernel's own: a team nested in one is not pooled by
       libgomp, and the kernel's threads would be made anew at each panel */
    for (int64_t p = 0; p < count && !status; p++) status = sc_one_panel(&c, p, 0, &spent[0]);
  } else {
    #pragma omp parallel for schedule(dynamic, 1) num_threads(workers)
    for (int64_t p = 0; p < count; p++) {
      int failed;
      #pragma omp atomic read
      failed = status;
      if (failed) continue;
#ifdef _OPENMP
      int w = omp_get_thread_num();
#else
      int w = 0;
#endif
      int got = sc_one_panel(&c, p, w, &spent[w]);
      if (got) {
        #pragma omp atomic write
        status = got;
      }
    }
  }
  int64_t most = 0;
  for (int w = 0; w < workers; w++) most = spent[w] > most ? spent[w] : most;
  *kernel_ns = most;
  return status;
}
