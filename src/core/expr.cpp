#include "core/expr.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <stdexcept>

namespace luminal {
namespace {

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

int cmp_atom(const Atom& x, const Atom& y);

int cmp_factors(const std::vector<AtomP>& x, const std::vector<AtomP>& y) {
  if (x.size() != y.size()) return x.size() < y.size() ? -1 : 1;
  for (size_t i = 0; i < x.size(); ++i)
    if (int c = cmp_atom(*x[i], *y[i])) return c;
  return 0;
}

int cmp_poly(const Poly& x, const Poly& y) {
  if (&x == &y) return 0;
  if (x.terms.size() != y.terms.size()) return x.terms.size() < y.terms.size() ? -1 : 1;
  for (size_t i = 0; i < x.terms.size(); ++i) {
    if (int c = cmp_factors(x.terms[i].factors, y.terms[i].factors)) return c;
    if (x.terms[i].coef != y.terms[i].coef) return x.terms[i].coef < y.terms[i].coef ? -1 : 1;
  }
  return 0;
}

int cmp_atom(const Atom& x, const Atom& y) {
  if (&x == &y) return 0;
  if (x.kind != y.kind) return x.kind < y.kind ? -1 : 1;
  if (x.kind == AtomKind::Var) return x.name.compare(y.name);
  if (int c = cmp_poly(x.a.poly(), y.a.poly())) return c;
  return cmp_poly(x.b.poly(), y.b.poly());
}

Expr make(std::vector<Term> terms) {
  std::sort(terms.begin(), terms.end(),
            [](const Term& a, const Term& b) { return cmp_factors(a.factors, b.factors) < 0; });
  auto p = std::make_shared<Poly>();
  for (auto& t : terms) {
    if (!p->terms.empty() && cmp_factors(p->terms.back().factors, t.factors) == 0)
      p->terms.back().coef += t.coef;
    else
      p->terms.push_back(std::move(t));
    if (p->terms.back().coef == 0) p->terms.pop_back();
  }
  size_t h = 0x51ed27;
  for (auto& t : p->terms) {
    h = mix(h, std::hash<int64_t>()(t.coef));
    for (auto& f : t.factors) h = mix(h, f->hash);
  }
  p->hash = h;
  return Expr(std::shared_ptr<const Poly>(std::move(p)));
}

Expr atom(AtomKind kind, const Expr& a, const Expr& b, const std::string& name = "") {
  auto at = std::make_shared<Atom>();
  at->kind = kind;
  at->name = name;
  at->a = a;
  at->b = b;
  at->hash = mix(mix(mix(size_t(kind) + 1, std::hash<std::string>()(name)), a.hash()), b.hash());
  return make({Term{{AtomP(std::move(at))}, 1}});
}

int64_t floordiv(int64_t a, int64_t b) {
  if (b == 0) throw std::domain_error("division by zero in a symbolic expression");
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t floormod(int64_t a, int64_t b) { return a - floordiv(a, b) * b; }

// Splits `a` into (terms whose coefficient `c` divides) / c and the remaining terms.
std::pair<Expr, Expr> split_divisible(const Expr& a, int64_t c) {
  std::vector<Term> q, r;
  for (auto& t : a.poly().terms) {
    if (t.coef % c == 0) q.push_back(Term{t.factors, t.coef / c});
    else r.push_back(t);
  }
  return {make(std::move(q)), make(std::move(r))};
}

std::string wrap(const Expr& e) {
  auto s = e.str();
  auto& t = e.poly().terms;
  bool simple = e.is_const() ? e.as_const() >= 0 : (t.size() == 1 && t[0].coef == 1 && t[0].factors.size() == 1);
  return simple ? s : "(" + s + ")";
}

std::string atom_str(const Atom& a) {
  switch (a.kind) {
    case AtomKind::Var: return a.name;
    case AtomKind::Div: return "(" + wrap(a.a) + " / " + wrap(a.b) + ")";
    case AtomKind::Mod: return "(" + wrap(a.a) + " % " + wrap(a.b) + ")";
    case AtomKind::Min: return "min(" + a.a.str() + ", " + a.b.str() + ")";
    case AtomKind::Max: return "max(" + a.a.str() + ", " + a.b.str() + ")";
    case AtomKind::Lt: return "(" + wrap(a.a) + " < " + wrap(a.b) + ")";
  }
  return "?";
}

int64_t eval_atom(const Atom& a, const Bindings& b) {
  if (a.kind == AtomKind::Var) {
    auto it = b.find(a.name);
    if (it == b.end()) throw UnboundDimension(a.name);
    return it->second;
  }
  int64_t x = a.a.eval(b), y = a.b.eval(b);
  switch (a.kind) {
    case AtomKind::Div: return floordiv(x, y);
    case AtomKind::Mod: return floormod(x, y);
    case AtomKind::Min: return std::min(x, y);
    case AtomKind::Max: return std::max(x, y);
    case AtomKind::Lt: return x < y;
    default: return 0;
  }
}

// Recursive-descent parser for the textual form, e.g. "(s+31)/32".
struct Parser {
  const std::string& s;
  size_t i = 0;
  [[noreturn]] void fail(const std::string& what) {
    throw std::invalid_argument("cannot parse expression '" + s + "': " + what + " at position " + std::to_string(i));
  }
  void ws() { while (i < s.size() && std::isspace((unsigned char)s[i])) ++i; }
  bool eat(char c) { ws(); if (i < s.size() && s[i] == c) { ++i; return true; } return false; }
  Expr cmp() {
    Expr e = sum();
    if (eat('<')) e = lt(e, sum());
    return e;
  }
  Expr sum() {
    Expr e = product();
    for (;;) {
      if (eat('+')) e = e + product();
      else if (eat('-')) e = e - product();
      else return e;
    }
  }
  Expr product() {
    Expr e = unary();
    for (;;) {
      if (eat('*')) e = e * unary();
      else if (eat('/')) { eat('/'); e = e / unary(); }  // accept both / and //
      else if (eat('%')) e = e % unary();
      else return e;
    }
  }
  Expr unary() {
    if (eat('-')) return -unary();
    return primary();
  }
  Expr primary() {
    ws();
    if (eat('(')) { Expr e = cmp(); if (!eat(')')) fail("expected ')'"); return e; }
    if (i < s.size() && std::isdigit((unsigned char)s[i])) {
      int64_t v = 0;
      while (i < s.size() && std::isdigit((unsigned char)s[i])) {
        int digit = s[i++] - '0';
        if (v > (INT64_MAX - digit) / 10) fail("integer literal too large");
        v = v * 10 + digit;
      }
      return Expr(v);
    }
    if (i < s.size() && (std::isalpha((unsigned char)s[i]) || s[i] == '_')) {
      size_t j = i;
      while (i < s.size() && (std::isalnum((unsigned char)s[i]) || s[i] == '_')) ++i;
      std::string name = s.substr(j, i - j);
      if ((name == "min" || name == "max") && eat('(')) {
        Expr a = cmp();
        if (!eat(',')) fail("expected ','");
        Expr b = cmp();
        if (!eat(')')) fail("expected ')'");
        return name == "min" ? min(a, b) : max(a, b);
      }
      return Expr::var(name);
    }
    fail(i < s.size() ? std::string("unexpected '") + s[i] + "'" : "unexpected end");
  }
};

}  // namespace

Expr::Expr() : Expr(int64_t(0)) {}
Expr::Expr(int64_t c) {
  std::vector<Term> t;
  if (c != 0) t.push_back(Term{{}, c});
  *this = make(std::move(t));
}
Expr Expr::var(const std::string& name) {
  if (name.empty()) throw std::invalid_argument("a symbolic variable needs a name");
  return atom(AtomKind::Var, Expr(0), Expr(0), name);
}
Expr Expr::parse(const std::string& text) {
  Parser p{text};
  Expr e = p.cmp();
  p.ws();
  if (p.i != text.size()) p.fail("unexpected trailing text");
  return e;
}

bool Expr::is_const() const { return p_->terms.empty() || (p_->terms.size() == 1 && p_->terms[0].factors.empty()); }
int64_t Expr::as_const() const {
  if (!is_const()) throw std::invalid_argument("expression '" + str() + "' is not a constant");
  return p_->terms.empty() ? 0 : p_->terms[0].coef;
}
bool Expr::is_var() const {
  return p_->terms.size() == 1 && p_->terms[0].coef == 1 && p_->terms[0].factors.size() == 1 &&
         p_->terms[0].factors[0]->kind == AtomKind::Var;
}
std::vector<std::string> Expr::vars() const {
  std::vector<std::string> out;
  std::function<void(const Expr&)> walk = [&](const Expr& e) {
    for (auto& t : e.poly().terms)
      for (auto& f : t.factors) {
        if (f->kind == AtomKind::Var) out.push_back(f->name);
        else { walk(f->a); walk(f->b); }
      }
  };
  walk(*this);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t Expr::eval(const Bindings& b) const {
  int64_t sum = 0;
  for (auto& t : p_->terms) {
    int64_t v = t.coef;
    for (auto& f : t.factors) v *= eval_atom(*f, b);
    sum += v;
  }
  return sum;
}

Expr Expr::substitute(const std::string& name, const Expr& value) const {
  Expr sum(0);
  for (auto& t : p_->terms) {
    Expr prod(t.coef);
    for (auto& f : t.factors) {
      Expr x;
      switch (f->kind) {
        case AtomKind::Var: x = f->name == name ? value : Expr::var(f->name); break;
        case AtomKind::Div: x = f->a.substitute(name, value) / f->b.substitute(name, value); break;
        case AtomKind::Mod: x = f->a.substitute(name, value) % f->b.substitute(name, value); break;
        case AtomKind::Min: x = min(f->a.substitute(name, value), f->b.substitute(name, value)); break;
        case AtomKind::Max: x = max(f->a.substitute(name, value), f->b.substitute(name, value)); break;
        case AtomKind::Lt: x = lt(f->a.substitute(name, value), f->b.substitute(name, value)); break;
      }
      prod = prod * x;
    }
    sum = sum + prod;
  }
  return sum;
}

std::string Expr::str() const {
  if (p_->terms.empty()) return "0";
  // Canonical order puts the constant first; print it last, as people write it.
  std::vector<const Term*> order;
  for (auto& t : p_->terms) if (!t.factors.empty()) order.push_back(&t);
  for (auto& t : p_->terms) if (t.factors.empty()) order.push_back(&t);
  std::string out;
  for (size_t k = 0; k < order.size(); ++k) {
    const Term& t = *order[k];
    int64_t c = t.coef;
    if (k > 0) { out += c < 0 ? " - " : " + "; c = c < 0 ? -c : c; }
    std::string f;
    for (size_t j = 0; j < t.factors.size(); ++j) f += (j ? "*" : "") + atom_str(*t.factors[j]);
    if (f.empty()) out += std::to_string(c);
    else if (c == 1) out += f;
    else if (c == -1) out += "-" + f;
    else out += std::to_string(c) + "*" + f;
  }
  return out;
}

size_t Expr::hash() const { return p_->hash; }

Expr operator+(const Expr& a, const Expr& b) {
  if (b.p_->terms.empty()) return a;
  if (a.p_->terms.empty()) return b;
  std::vector<Term> t = a.p_->terms;
  t.insert(t.end(), b.p_->terms.begin(), b.p_->terms.end());
  return make(std::move(t));
}
Expr Expr::operator-() const { return *this * Expr(-1); }
Expr operator-(const Expr& a, const Expr& b) { return a + (-b); }

Expr operator*(const Expr& a, const Expr& b) {
  if (a.is_const() && a.as_const() == 1) return b;
  if (b.is_const() && b.as_const() == 1) return a;
  std::vector<Term> out;
  for (auto& x : a.p_->terms)
    for (auto& y : b.p_->terms) {
      Term t{{}, x.coef * y.coef};
      std::merge(x.factors.begin(), x.factors.end(), y.factors.begin(), y.factors.end(),
                 std::back_inserter(t.factors), [](const AtomP& p, const AtomP& q) { return cmp_atom(*p, *q) < 0; });
      out.push_back(std::move(t));
    }
  return make(std::move(out));
}

Expr operator/(const Expr& a, const Expr& b) {
  if (b.is_const()) {
    int64_t c = b.as_const();
    if (c == 0) throw std::domain_error("division by zero in symbolic expression '" + a.str() + " / 0'");
    if (a.is_const()) return Expr(floordiv(a.as_const(), c));
    if (c == 1) return a;
    if (c > 0) {
      // floor((c*q + r) / c) == q + floor(r / c) for integers.
      auto [q, r] = split_divisible(a, c);
      if (r.is_const()) return q + Expr(floordiv(r.as_const(), c));
      if (q.p_->terms.empty()) return atom(AtomKind::Div, r, b);
      return q + r / b;
    }
  }
  if (a == b) return Expr(1);
  return atom(AtomKind::Div, a, b);
}

Expr operator%(const Expr& a, const Expr& b) {
  if (b.is_const()) {
    int64_t c = b.as_const();
    if (c == 0) throw std::domain_error("modulo by zero in symbolic expression '" + a.str() + " % 0'");
    if (a.is_const()) return Expr(floormod(a.as_const(), c));
    if (c == 1 || c == -1) return Expr(0);
    if (c > 0) {
      Expr r = split_divisible(a, c).second;  // (c*q + r) % c == r % c
      if (r.is_const()) return Expr(floormod(r.as_const(), c));
      auto& rt = r.p_->terms;
      if (rt.size() == 1 && rt[0].coef == 1 && rt[0].factors.size() == 1 && rt[0].factors[0]->kind == AtomKind::Mod &&
          rt[0].factors[0]->b == b)
        return r;  // (x % c) % c
      return atom(AtomKind::Mod, r, b);
    }
  }
  if (a == b) return Expr(0);
  return atom(AtomKind::Mod, a, b);
}

Expr min(const Expr& a, const Expr& b) {
  Expr d = a - b;
  if (d.is_const()) return d.as_const() <= 0 ? a : b;
  return compare(a, b) <= 0 ? atom(AtomKind::Min, a, b) : atom(AtomKind::Min, b, a);
}
Expr max(const Expr& a, const Expr& b) {
  Expr d = a - b;
  if (d.is_const()) return d.as_const() >= 0 ? a : b;
  return compare(a, b) <= 0 ? atom(AtomKind::Max, a, b) : atom(AtomKind::Max, b, a);
}
Expr lt(const Expr& a, const Expr& b) {
  Expr d = a - b;
  if (d.is_const()) return Expr(d.as_const() < 0 ? 1 : 0);
  return atom(AtomKind::Lt, a, b);
}

bool operator==(const Expr& a, const Expr& b) {
  return a.p_ == b.p_ || (a.p_->hash == b.p_->hash && cmp_poly(*a.p_, *b.p_) == 0);
}
int compare(const Expr& a, const Expr& b) { return cmp_poly(*a.p_, *b.p_); }

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].str();
  return out + (s.size() == 1 ? ",)" : ")");
}

Expr numel(const Shape& s) {
  Expr n(1);
  for (auto& d : s) n = n * d;
  return n;
}

}  // namespace luminal
