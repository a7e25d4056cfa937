// Symbolic integer expressions in a canonical form, so that equal expressions compare and hash equal.
//
// An expression is a polynomial with integer coefficients: a sorted sum of terms, each a coefficient times a
// sorted product of atoms. Atoms are variables and the operations a polynomial cannot express
// (floor division, modulo, min, max, less-than), whose operands are themselves canonical. Construction
// folds constants and applies the few identities that keep index arithmetic small, e.g.
// (4*s + 3) / 4 == s and (4*s + 3) % 4 == 3.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace luminal {

struct Atom;
struct Poly;
using AtomP = std::shared_ptr<const Atom>;
using Bindings = std::unordered_map<std::string, int64_t>;

// Evaluating an expression whose variable has no value.
struct UnboundDimension : std::invalid_argument {
  explicit UnboundDimension(const std::string& name)
      : std::invalid_argument("symbolic dimension '" + name + "' is not bound (bind it with set() or set_dim())") {}
};

class Expr {
 public:
  Expr();                  // 0
  Expr(int64_t c);         // constant (implicit on purpose: `e + 1`)
  static Expr var(const std::string& name);
  static Expr parse(const std::string& text);  // "s+3", "(s+31)/32", "min(s, 4)"

  bool is_const() const;
  int64_t as_const() const;  // throws unless is_const()
  bool is_var() const;       // exactly one variable with coefficient 1
  std::vector<std::string> vars() const;

  int64_t eval(const Bindings& b) const;  // throws UnboundDimension naming the variable
  Expr substitute(const std::string& name, const Expr& value) const;
  std::string str() const;
  size_t hash() const;

  friend Expr operator+(const Expr& a, const Expr& b);
  friend Expr operator-(const Expr& a, const Expr& b);
  friend Expr operator*(const Expr& a, const Expr& b);
  friend Expr operator/(const Expr& a, const Expr& b);  // floor division
  friend Expr operator%(const Expr& a, const Expr& b);  // floor modulo
  Expr operator-() const;
  friend Expr min(const Expr& a, const Expr& b);
  friend Expr max(const Expr& a, const Expr& b);
  friend Expr lt(const Expr& a, const Expr& b);  // 1 if a < b else 0
  friend bool operator==(const Expr& a, const Expr& b);
  friend bool operator!=(const Expr& a, const Expr& b) { return !(a == b); }
  friend int compare(const Expr& a, const Expr& b);  // a total order, for sorting

  const Poly& poly() const { return *p_; }
  explicit Expr(std::shared_ptr<const Poly> p) : p_(std::move(p)) {}

 private:
  std::shared_ptr<const Poly> p_;
};

enum class AtomKind : uint8_t { Var, Div, Mod, Min, Max, Lt };

struct Atom {
  AtomKind kind;
  std::string name;    // Var
  Expr a, b;           // operands of the others
  size_t hash;
};

struct Term {
  std::vector<AtomP> factors;  // sorted; empty for the constant term
  int64_t coef;
};

struct Poly {
  std::vector<Term> terms;  // sorted by factors, no zero coefficients
  size_t hash;
};

struct ExprHash {
  size_t operator()(const Expr& e) const { return e.hash(); }
};

using Shape = std::vector<Expr>;
std::string shape_str(const Shape& s);
Expr numel(const Shape& s);

}  // namespace luminal
