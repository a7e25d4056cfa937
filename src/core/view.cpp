#include "core/view.h"

#include <stdexcept>

namespace luminal {
namespace {

// 1 when the only index (0) of a size-1 dim with valid range [lo, hi) is valid, else 0 (symbolic if need be).
Expr one_valid(const std::pair<Expr, Expr>& m) { return lt(m.first, Expr(1)) * lt(Expr(0), m.second); }

void check_axis(const View& v, int axis, const char* op) {
  if (axis < 0 || axis >= int(v.rank()))
    throw std::out_of_range(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for shape " +
                            shape_str(v.shape));
}

}  // namespace

View View::contiguous(const Shape& shape) {
  View v;
  v.shape = shape;
  v.strides.resize(shape.size());
  Expr s(1);
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    v.strides[i] = s;
    s = s * shape[i];
  }
  return v;
}

bool View::is_contiguous() const {
  if (has_mask() || !offset.is_const() || offset.as_const() != 0) return false;
  Expr s(1);
  for (int i = int(rank()) - 1; i >= 0; --i) {
    // A size-1 dim's stride never matters.
    if (!(shape[i].is_const() && shape[i].as_const() == 1) && strides[i] != s) return false;
    s = s * shape[i];
  }
  return true;
}

View View::permute(const std::vector<int>& axes) const {
  if (axes.size() != rank()) throw std::invalid_argument("permute: " + std::to_string(axes.size()) +
                                                         " axes given for shape " + shape_str(shape));
  std::vector<bool> seen(rank());
  View v;
  v.offset = offset;
  for (int a : axes) {
    check_axis(*this, a, "permute");
    if (seen[a]) throw std::invalid_argument("permute: axis " + std::to_string(a) + " repeats");
    seen[a] = true;
    v.shape.push_back(shape[a]);
    v.strides.push_back(strides[a]);
    if (has_mask()) v.mask.push_back(mask[a]);
  }
  return v;
}

View View::expand(int axis, const Expr& size) const {
  check_axis(*this, axis, "expand");
  if (shape[axis] == size) return *this;
  if (!(shape[axis].is_const() && shape[axis].as_const() == 1))
    throw std::invalid_argument("expand: dim " + std::to_string(axis) + " of shape " + shape_str(shape) +
                                " has size " + shape[axis].str() + ", only size-1 dims can expand (to " + size.str() + ")");
  View v = *this;
  v.shape[axis] = size;
  v.strides[axis] = Expr(0);
  if (has_mask()) v.mask[axis] = {Expr(0), size * one_valid(mask[axis])};
  return v;
}

View View::unsqueeze(int axis) const {
  if (axis < 0 || axis > int(rank())) throw std::out_of_range("unsqueeze: axis out of range for shape " + shape_str(shape));
  View v = *this;
  v.shape.insert(v.shape.begin() + axis, Expr(1));
  v.strides.insert(v.strides.begin() + axis, Expr(0));
  if (has_mask()) v.mask.insert(v.mask.begin() + axis, {Expr(0), Expr(1)});
  return v;
}

View View::squeeze(int axis) const {
  check_axis(*this, axis, "squeeze");
  if (!(shape[axis].is_const() && shape[axis].as_const() == 1))
    throw std::invalid_argument("squeeze: dim " + std::to_string(axis) + " of shape " + shape_str(shape) + " is not 1");
  View v = *this;
  if (has_mask()) {
    Expr valid = one_valid(mask[axis]);
    if (valid != Expr(1)) {
      // The single element may be padding: carry its validity into another dim's mask.
      if (rank() == 1) throw std::invalid_argument("squeeze: cannot drop the only (padded) dim");
      auto& other = v.mask[axis == 0 ? 1 : 0];
      other.second = other.second * valid;
    }
    v.mask.erase(v.mask.begin() + axis);
  }
  v.shape.erase(v.shape.begin() + axis);
  v.strides.erase(v.strides.begin() + axis);
  return v;
}

std::optional<View> View::reshape(const Shape& new_shape) const {
  if (numel(new_shape) != numel(shape))
    throw std::invalid_argument("reshape: cannot view shape " + shape_str(shape) + " as " + shape_str(new_shape) +
                                " (element counts differ)");
  if (new_shape == shape) return *this;
  auto is_one = [](const Expr& e) { return e.is_const() && e.as_const() == 1; };
  // Only size-1 dims inserted or removed: edit dims one by one, which keeps any mask.
  Shape a, b;
  for (auto& d : shape) if (!is_one(d)) a.push_back(d);
  for (auto& d : new_shape) if (!is_one(d)) b.push_back(d);
  if (a.empty()) {
    // Only size-1 dims on both sides: one element, valid when every old dim's single index is.
    View v = contiguous(new_shape);
    v.offset = offset;
    if (has_mask()) {
      Expr valid(1);
      for (auto& m : mask) valid = valid * one_valid(m);
      if (new_shape.empty()) return valid == Expr(1) ? std::optional<View>(v) : std::nullopt;
      for (size_t i = 0; i < new_shape.size(); ++i) v.mask.push_back({Expr(0), i == 0 ? valid : Expr(1)});
    }
    return v;
  }
  if (a == b) {
    View v = *this;
    try {
      for (int i = int(v.rank()) - 1; i >= 0; --i) if (is_one(v.shape[i])) v = v.squeeze(i);
    } catch (const std::invalid_argument&) {
      return std::nullopt;  // an all-padding view of size-1 dims: let the caller copy
    }
    for (int i = 0; i < int(new_shape.size()); ++i) if (is_one(new_shape[i])) v = v.unsqueeze(i);
    return v;
  }
  if (has_mask()) return std::nullopt;
  if (is_contiguous()) {
    View v = contiguous(new_shape);
    v.offset = offset;
    return v;
  }
  // Group old dims into chunks that are contiguous with each other, then match new dims to chunks by
  // element count (as torch's view does). Sizes are compared as canonical expressions.
  View v;
  v.shape = new_shape;
  v.offset = offset;
  v.strides.assign(new_shape.size(), Expr(0));
  int vd = int(new_shape.size()) - 1;
  if (rank() == 0) return contiguous(new_shape);
  Expr base = strides.back(), tn(1), vn(1);
  for (int td = int(rank()) - 1; td >= 0; --td) {
    tn = tn * shape[td];
    if (td == 0 || (!is_one(shape[td - 1]) && strides[td - 1] != tn * base)) {
      while (vd >= 0 && (vn != tn || is_one(new_shape[vd]))) {
        v.strides[vd] = vn * base;
        vn = vn * new_shape[vd];
        --vd;
        if (vn == tn) break;
      }
      if (vn != tn) return std::nullopt;
      if (td > 0) { base = strides[td - 1]; tn = Expr(1); vn = Expr(1); }
    }
  }
  while (vd >= 0 && is_one(new_shape[vd])) v.strides[vd--] = Expr(0);
  if (vd != -1) return std::nullopt;
  return v;
}

View View::slice(int axis, const Expr& start, const Expr& stop, int64_t step) const {
  check_axis(*this, axis, "slice");
  if (step <= 0) throw std::invalid_argument("slice: step must be positive");
  View v = *this;
  Expr len = (stop - start + Expr(step - 1)) / Expr(step);
  v.shape[axis] = len;
  v.offset = offset + start * strides[axis];
  v.strides[axis] = strides[axis] * Expr(step);
  if (has_mask()) {
    // Index j maps to old index start + j*step; valid while lo <= that < hi.
    auto [lo, hi] = mask[axis];
    Expr nlo = max(Expr(0), (lo - start + Expr(step - 1)) / Expr(step));
    Expr nhi = min(len, max(Expr(0), (hi - start + Expr(step - 1)) / Expr(step)));
    v.mask[axis] = {nlo, nhi};
  }
  return v;
}

View View::pad(int axis, const Expr& before, const Expr& after) const {
  check_axis(*this, axis, "pad");
  View v = *this;
  if (!has_mask()) {
    for (auto& d : shape) v.mask.push_back({Expr(0), d});
  }
  v.shape[axis] = shape[axis] + before + after;
  v.offset = offset - before * strides[axis];
  v.mask[axis] = {v.mask[axis].first + before, v.mask[axis].second + before};
  return v;
}

View View::flip(int axis) const {
  check_axis(*this, axis, "flip");
  View v = *this;
  v.offset = offset + (shape[axis] - Expr(1)) * strides[axis];
  v.strides[axis] = -strides[axis];
  if (has_mask()) v.mask[axis] = {shape[axis] - mask[axis].second, shape[axis] - mask[axis].first};
  return v;
}

View View::unfold(int axis, const Expr& size, const Expr& step, const Expr& dilation) const {
  check_axis(*this, axis, "unfold");
  for (const Expr* e : {&size, &step, &dilation})
    if (e->is_const() && e->as_const() < 1)
      throw std::invalid_argument("unfold: size, step and dilation must be positive, got size " + size.str() +
                                  ", step " + step.str() + ", dilation " + dilation.str());
  Expr span = dilation * (size - Expr(1)) + Expr(1);
  if (shape[axis].is_const() && span.is_const() && span.as_const() > shape[axis].as_const())
    throw std::invalid_argument("unfold: a window spans " + span.str() + " elements but dim " + std::to_string(axis) +
                                " of shape " + shape_str(shape) + " has " + shape[axis].str());
  if (has_mask() && (mask[axis].first != Expr(0) || mask[axis].second != shape[axis]))
    throw std::invalid_argument("unfold: dim " + std::to_string(axis) + " of shape " + shape_str(shape) +
                                " is padded; copy it first");
  View v = *this;
  v.shape[axis] = (shape[axis] - span) / step + Expr(1);
  v.strides[axis] = strides[axis] * step;
  v.shape.push_back(size);
  v.strides.push_back(strides[axis] * dilation);
  if (has_mask()) {
    v.mask[axis] = {Expr(0), v.shape[axis]};
    v.mask.push_back({Expr(0), size});
  }
  return v;
}

std::string View::str() const {
  std::string s = "shape=" + shape_str(shape) + " strides=" + shape_str(strides);
  if (!(offset.is_const() && offset.as_const() == 0)) s += " offset=" + offset.str();
  if (has_mask()) {
    s += " mask=[";
    for (size_t i = 0; i < mask.size(); ++i) s += (i ? ", " : "") + mask[i].first.str() + ":" + mask[i].second.str();
    s += "]";
  }
  return s;
}

size_t View::hash() const {
  size_t h = offset.hash();
  auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (auto& e : shape) mix(e.hash());
  for (auto& e : strides) mix(e.hash());
  for (auto& [a, b] : mask) { mix(a.hash()); mix(b.hash()); }
  return h;
}

bool operator==(const View& a, const View& b) {
  return a.shape == b.shape && a.strides == b.strides && a.offset == b.offset && a.mask == b.mask;
}

bool ConcreteView::reads_within(int64_t numel) const {
  int64_t lo = offset, hi = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return true;
    int64_t span = (shape[d] - 1) * strides[d];
    (span < 0 ? lo : hi) += span;
  }
  return lo >= 0 && hi < numel;
}

ConcreteView::ConcreteView(const View& v, const Bindings& b) {
  offset = v.offset.eval(b);
  for (size_t i = 0; i < v.rank(); ++i) {
    shape.push_back(v.shape[i].eval(b));
    strides.push_back(v.strides[i].eval(b));
  }
  masked = v.has_mask();
  for (auto& [l, h] : v.mask) {
    lo.push_back(l.eval(b));
    hi.push_back(h.eval(b));
  }
}

}  // namespace luminal

namespace luminal {
bool ConcreteView::is_plain(const std::vector<int64_t>& want) const {
  if (masked || offset != 0 || shape != want) return false;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}
}  // namespace luminal
