/* sparsec's copies of dense operands (`sparsec.runtime.copies`): a 2-D array read at any
   element strides (rs between rows, cs between columns), written C-ordered into `out`, on
   `threads` OpenMP threads. Each thread copies the same rows of every band of columns; a
   band is one cache line of an output row, so its reads follow BAND source streams and its
   writes fill whole lines (numpy's copy of a transpose reads a column of the source for
   every output row). Values are copied as bits: any dtype of the width. */
#include <stdint.h>

#define SC_COPY2D(name, T, BAND)                                                          \
  void name(const T* restrict in, T* restrict out, int64_t rows, int64_t cols, int64_t rs, \
            int64_t cs, int threads) {                                                    \
    _Pragma("omp parallel num_threads(threads) if(threads > 1)")                          \
    for (int64_t cb = 0; cb < cols; cb += BAND) {                                         \
      int64_t ce = cb + BAND < cols ? cb + BAND : cols;                                   \
      _Pragma("omp for schedule(static) nowait")                                          \
      for (int64_t r = 0; r < rows; r++) {                                                \
        for (int64_t c = cb; c < ce; c++) out[r * cols + c] = in[r * rs + c * cs];        \
      }                                                                                   \
    }                                                                                     \
  }

SC_COPY2D(sparsec_copy2d_2, uint16_t, 32)
SC_COPY2D(sparsec_copy2d_4, uint32_t, 16)
SC_COPY2D(sparsec_copy2d_8, uint64_t, 8)
