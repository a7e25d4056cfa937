// A Contraction (a convolution: a product summed over several trailing dims) as an implicit GEMM on the GPU: the
// layout its kernels read from their parameter slice, worked out by the runtime from the evaluated views (which dims
// are the GEMM's rows, columns and batch depends on the strides, known only then). The kernels are printed by
// contraction_step in codegen.cpp.
#pragma once
#include <cstdint>

#include "core/view.h"

namespace luminal {
namespace cuda {

// Tile of outputs per block (rows x columns) of both implicit-GEMM kernels, and their k per tile.
constexpr int kContractionTile = 64;
inline int contraction_bk(bool mma) { return mma ? 32 : 16; }

// Slots after the two views: M, N, batches, K, a's and b's staging order (1: along rows, 0: along k), the k splits,
// then per outer dim (the output's dims) its size as a row dim, as a column dim, as a batch dim (1 where it is not
// one) and the output's stride along it.
inline int contraction_extra(int outer) { return 7 + 4 * outer; }

// Fills those slots for operands `a` and `b` (equal shapes; their last `axes` dims summed), k tiles of `bk`, and
// the grid (row tiles, column tiles, batches x splits); false where the grid would not fit (the generic kernel runs
// then). Where the tiles leave most of the `sms` multiprocessors idle and `can_split`, k is split over blocks whose
// partial sums are added into the (zeroed) output.
bool contraction_layout(const ConcreteView& a, const ConcreteView& b, int axes, int bk, bool can_split, int sms,
                        int64_t* slots, unsigned grid[3]);

}  // namespace cuda
}  // namespace luminal
