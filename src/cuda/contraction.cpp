#include "cuda/contraction.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace luminal {
namespace cuda {
namespace {

// How many consecutive elements the innermost of `dims` (innermost last; size-1 dims left out) read as one run
// of memory: the staging walks the faster of an operand's rows and its k, so that a warp's loads coalesce.
int64_t run_length(const ConcreteView& v, const std::vector<size_t>& dims) {
  int64_t run = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    size_t d = dims[i];
    if (v.strides[d] != run) break;
    run *= v.shape[d];
  }
  return run;
}

}  // namespace

bool contraction_layout(const ConcreteView& a, const ConcreteView& b, int axes, int bk, bool can_split, int sms,
                        int64_t* x, unsigned grid[3]) {
  size_t r = a.shape.size(), outer = r - size_t(axes);
  if (r < size_t(axes) || b.shape != a.shape) return false;
  int64_t M = 1, N = 1, batch = 1, K = 1, stride = 1;
  std::vector<size_t> rows, cols, red;
  for (size_t d = outer; d-- > 0;) {  // (the output is contiguous)
    x[7 + 3 * outer + d] = stride;
    stride *= a.shape[d];
  }
  for (size_t d = 0; d < outer; ++d) {
    int64_t n = a.shape[d];
    int64_t *rs = &x[7 + d], *cs = &x[7 + outer + d], *bs = &x[7 + 2 * outer + d];
    *rs = *cs = *bs = 1;
    if (n == 1) continue;
    // Both operands move along it: a batch dim; else a row dim (b does not move) or a column dim (a does not).
    if (a.strides[d] && b.strides[d]) *bs = n, batch *= n;
    else if (!b.strides[d]) *rs = n, M *= n, rows.push_back(d);
    else *cs = n, N *= n, cols.push_back(d);
  }
  for (size_t d = outer; d < r; ++d) {
    K *= a.shape[d];
    if (a.shape[d] != 1) red.push_back(d);
  }
  const int64_t T = kContractionTile;
  int64_t tm = (M + T - 1) / T, tn = (N + T - 1) / T;
  if (tm > 0x7fffffff || tn > 65535 || batch > 65535) return false;
  // Split k where the tiles fill under a wave of the GPU: about two blocks per multiprocessor, each at least 4
  // tiles of k (a convolution late in a network: few output pixels, long k).
  int64_t kt = (K + bk - 1) / bk, splits = 1, tiles = tm * tn * batch;
  if (can_split && tiles < sms && kt >= 8) {
    splits = std::min<int64_t>({(2 * sms + tiles - 1) / tiles, kt / 4, 65535 / batch});
    int64_t per = (kt + splits - 1) / splits;
    splits = (kt + per - 1) / per;  // (no split left without k)
  }
  x[0] = M, x[1] = N, x[2] = batch, x[3] = K, x[6] = std::max<int64_t>(splits, 1);
  // (a convolution's input runs along its output rows; its weights along k)
  x[4] = run_length(a, rows) > run_length(a, red);
  x[5] = run_length(b, cols) > run_length(b, red);
  grid[0] = unsigned(tm), grid[1] = unsigned(tn), grid[2] = unsigned(batch * x[6]);
  return true;
}

}  // namespace cuda
}  // namespace luminal
