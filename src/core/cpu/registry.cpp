// The CPU kernels of backend ops, by op type.
#include <unordered_map>

#include "core/cpu/cpu.h"

namespace luminal {
namespace {
std::unordered_map<std::type_index, CustomKernel>& kernels() {
  static std::unordered_map<std::type_index, CustomKernel> k;  // filled by the kernel files' static registrars
  return k;
}
}  // namespace

void register_cpu_kernel(std::type_index op, CustomKernel k) { kernels()[op] = std::move(k); }

const CustomKernel* cpu_kernel(const KernelOp& op) {
  if (auto* h = dynamic_cast<const HostOp*>(&op)) return &h->kernel();
  auto it = kernels().find(typeid(op));
  return it == kernels().end() ? nullptr : &it->second;
}

}  // namespace luminal
