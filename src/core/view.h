// A View maps a logical index to a physical element offset in a contiguous buffer, and says whether that
// index is valid (padding reads as zero). Every movement op (permute, expand, reshape, slice, pad, flip)
// edits the view instead of the data; only a reshape the strides cannot express needs a copy.
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "core/expr.h"

namespace luminal {

struct View {
  Shape shape;
  Shape strides;                           // in elements; 0 for broadcast dims
  Expr offset;
  std::vector<std::pair<Expr, Expr>> mask;  // per dim valid range [lo, hi); empty means all valid

  static View contiguous(const Shape& shape);

  size_t rank() const { return shape.size(); }
  bool is_contiguous() const;  // exactly contiguous(shape)
  bool has_mask() const { return !mask.empty(); }

  View permute(const std::vector<int>& axes) const;
  View expand(int axis, const Expr& size) const;   // dim `axis` must have size 1
  View unsqueeze(int axis) const;                  // insert a size-1 dim before `axis`
  View squeeze(int axis) const;                    // remove a size-1 dim
  std::optional<View> reshape(const Shape& shape) const;  // nullopt: the layout needs a copy first
  View slice(int axis, const Expr& start, const Expr& stop, int64_t step = 1) const;
  View pad(int axis, const Expr& before, const Expr& after) const;
  View flip(int axis) const;
  // Sliding windows (torch's Tensor.unfold with a dilation): dim `axis` of size n becomes the window starts,
  // (n - dilation*(size-1) - 1) / step + 1 of them, and a new last dim of `size` reads each window. Overlapping
  // strides, no copy: a convolution reads its input through this. The axis must not be padded.
  View unfold(int axis, const Expr& size, const Expr& step, const Expr& dilation) const;

  std::string str() const;
  size_t hash() const;
  friend bool operator==(const View& a, const View& b);
  friend bool operator!=(const View& a, const View& b) { return !(a == b); }
};

// A View with every expression evaluated, for executors.
struct ConcreteView {
  std::vector<int64_t> shape, strides, lo, hi;
  int64_t offset = 0;
  bool masked = false;
  ConcreteView() = default;
  // Reads a buffer of `shape` exactly as stored.
  bool is_plain(const std::vector<int64_t>& shape) const;
  // Every element an (unmasked) read can reach lies in a buffer of `numel` elements; an empty view reads nothing.
  bool reads_within(int64_t numel) const;
  ConcreteView(const View& v, const Bindings& b);
};

}  // namespace luminal
