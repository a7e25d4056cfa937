// Backend ops: what a compiler puts in place of primop patterns (a matmul, a fused kernel, a user's op). Each is a
// C++ type with its attributes, structural equality and hash (so CSE and the rewrite engine treat it like a
// primop), and a display name. Which backends can run it is the backends' business: each keeps its kernels by op
// type, and one asked to run an op it has no kernel for raises UnsupportedOpError.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

namespace luminal {

struct Node;
struct Buffer;
struct KernelArg;

// A CPU implementation: reads its inputs and writes every element of `out`, which the caller has allocated with
// the node's dtype and (evaluated) shape.
using CustomKernel = std::function<void(const std::vector<KernelArg>&, const Node&, Buffer& out)>;

class KernelOp {
 public:
  virtual ~KernelOp() = default;
  virtual std::string name() const = 0;
  virtual bool equals(const KernelOp& other) const = 0;  // same type and attributes
  virtual size_t hash() const = 0;
};

// The base of every op type: the type check of equality and hashing, once. `Derived` provides
// `bool same(const Derived&) const` and `size_t attr_hash() const` over its attributes.
template <class Derived>
class TypedOp : public KernelOp {
 public:
  bool equals(const KernelOp& other) const final {
    const auto* o = dynamic_cast<const Derived*>(&other);
    return o && static_cast<const Derived*>(this)->same(*o);
  }
  size_t hash() const final {
    return typeid(Derived).hash_code() ^ (static_cast<const Derived*>(this)->attr_hash() * 0x9e3779b97f4a7c15ULL);
  }
};

// An op a user compiler adds with its own CPU implementation (a Python CustomOp): named by the user, equal by name.
// No other backend can run it.
class HostOp : public TypedOp<HostOp> {
 public:
  HostOp(std::string name, CustomKernel kernel) : name_(std::move(name)), kernel_(std::move(kernel)) {}
  std::string name() const override { return name_; }
  const CustomKernel& kernel() const { return kernel_; }
  bool same(const HostOp& o) const { return name_ == o.name_; }
  size_t attr_hash() const { return std::hash<std::string>()(name_); }

 private:
  std::string name_;
  CustomKernel kernel_;
};

// A graph holds an op that the backend it is compiled for has no kernel for (raised at compile time).
struct UnsupportedOpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace luminal
