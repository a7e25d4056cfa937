// The pattern-rewrite engine every compiler pass is written in: find this pattern, replace it with that.
//
// A Pattern is a small tree of ops with predicates. Matching binds names to (node, view) pairs: the view is how
// the matched parent reads that node. An inner pattern matches only through a plain edge (the parent reads the
// child's output as it is), so a rewrite never has to compose views; leaves bind any view.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/graph.h"

namespace luminal {

struct Pattern {
  std::optional<Op> op;              // nullopt: any node
  std::string name;                  // bind under this name (a repeated name must bind the same node and view)
  std::vector<Pattern> inputs;       // empty: the inputs are not looked at
  std::optional<DType> dtype;
  std::optional<double> value;       // a Constant with this value
  std::string custom;                // a backend op of this display name
  bool single_use = false;           // the node has exactly one consumer
  bool commutative = true;           // for two-input patterns on Add/Mul: also try the inputs swapped
  std::function<bool(const Graph&, int64_t node, const View& view)> where;  // any other condition
};

// Builders: any node (bound under `name`), and a node of op `o` whose inputs match `inputs`.
inline Pattern any(const std::string& name) {
  Pattern p;
  p.name = name;
  return p;
}
inline Pattern op(Op o, std::vector<Pattern> inputs, const std::string& name = "") {
  Pattern p;
  p.op = o;
  p.inputs = std::move(inputs);
  p.name = name;
  return p;
}

struct Match {
  int64_t root = -1;
  std::unordered_map<std::string, Edge> bound;
  const Edge& operator[](const std::string& name) const;
};

bool match(const Graph& g, const Pattern& p, int64_t node, Match& m);

// A rewrite returns the replacement node (same shape and dtype as the root), or nullopt to leave it.
// A replacement of shape () for a root of another shape is read broadcast (a folded constant).
using Rewrite = std::function<std::optional<int64_t>(Graph&, const Match&)>;

struct Rule {
  std::string name;
  Pattern pattern;
  Rewrite rewrite;
};

// One sweep over the nodes alive at the start: each root is matched against the rules in order and the first
// rewrite that returns a node replaces it. Returns the number of rewrites.
size_t apply_rules(Graph& g, const std::vector<Rule>& rules);

// The hardware-agnostic passes of GenericCompiler. Each returns how many nodes it changed or removed.
size_t remove_dead_nodes(Graph& g);
size_t eliminate_common_subexpressions(Graph& g);
std::vector<Rule> arithmetic_rules();
std::vector<Rule> constant_folding_rules();

}  // namespace luminal
