// The scalar meaning of each elementwise primop, in double precision: one definition for executing and folding.
#pragma once
#include <cmath>

#include "core/graph.h"

namespace luminal {

inline double eval_unary(Op op, double x) {
  switch (op) {
    case Op::Log2: return std::log2(x);
    case Op::Exp2: return std::exp2(x);
    case Op::Sin: return std::sin(x);
    case Op::Sqrt: return std::sqrt(x);
    case Op::Recip: return 1.0 / x;
    default: return x;  // Cast, Output: a copy (the store rounds)
  }
}

inline double eval_binary(Op op, double a, double b) {
  switch (op) {
    case Op::Add: return a + b;
    case Op::Mul: return a * b;
    case Op::Mod: return std::fmod(a, b);  // C's fmod; Python's % is composed on top
    case Op::LessThan: return a < b ? 1.0 : 0.0;
    default: return 0;
  }
}

}  // namespace luminal
