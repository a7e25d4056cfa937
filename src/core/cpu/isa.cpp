// The CPU kernels' instruction-set level: detected once, overridable by LUMINAL_CPU_ISA (see isa.h).
#include "core/cpu/isa.h"

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace luminal {
namespace isa_detail {
std::atomic<int> current{-1};
bool vnni = false, dotprod = false;
}  // namespace isa_detail

namespace {

struct Caps {
  bool avx2 = false, avx512 = false, vnni = false, neon = false, dotprod = false;
};

Caps detect() {
  Caps c;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  c.vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
  c.neon = true;  // Advanced SIMD is part of every AArch64 CPU
#if defined(__linux__)
  c.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
  c.dotprod = true;  // every Apple silicon core has it
#endif
#endif
  return c;
}

const Caps& caps() {
  static const Caps c = detect();
  return c;
}

bool supports(CpuIsa i) {
  const Caps& c = caps();
  switch (i) {
    case CpuIsa::Portable: return true;
    case CpuIsa::Avx2: return c.avx2;
    case CpuIsa::Avx512: return c.avx512;
    case CpuIsa::Neon: return c.neon;
  }
  return false;
}

CpuIsa best() {
  for (CpuIsa i : {CpuIsa::Avx512, CpuIsa::Avx2, CpuIsa::Neon})
    if (supports(i)) return i;
  return CpuIsa::Portable;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

CpuIsa parse(const std::string& name, const char* source) {
  for (CpuIsa i : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Neon}) {
    if (name != cpu_isa_name(i)) continue;
    if (!supports(i))
      throw std::invalid_argument(std::string(source) + ": this CPU cannot run the '" + name +
                                  "' kernels (it supports: " + joined(supported_cpu_isas()) + ")");
    return i;
  }
  throw std::invalid_argument(std::string(source) + ": unknown CPU ISA level '" + name +
                              "' (expected avx2, avx512, neon or portable; this CPU supports: " +
                              joined(supported_cpu_isas()) + ")");
}

void store(CpuIsa i) {
  isa_detail::vnni = i == CpuIsa::Avx512 && caps().vnni;
  isa_detail::dotprod = i == CpuIsa::Neon && caps().dotprod;
  isa_detail::current.store(int(i), std::memory_order_relaxed);
}

std::mutex choose_mu;

}  // namespace

int isa_detail::choose() {
  std::lock_guard<std::mutex> l(choose_mu);
  int v = current.load();
  if (v >= 0) return v;
  CpuIsa i = best();
  auto set = [](const char* name) { const char* e = std::getenv(name); return e && *e && std::string(e) != "0"; };
  if (const char* e = std::getenv("LUMINAL_CPU_ISA"); e && *e) i = parse(e, "LUMINAL_CPU_ISA");
  else if (set("LUMINAL_NO_AVX2")) i = CpuIsa::Portable;  // the older switches, kept for existing scripts
  else if (set("LUMINAL_NO_AVX512") && i == CpuIsa::Avx512) i = CpuIsa::Avx2;
  store(i);
  return int(i);
}

const char* cpu_isa_name(CpuIsa i) {
  switch (i) {
    case CpuIsa::Portable: return "portable";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Neon: return "neon";
  }
  return "?";
}

std::vector<std::string> supported_cpu_isas() {
  std::vector<std::string> v;
  for (CpuIsa i : {CpuIsa::Avx512, CpuIsa::Avx2, CpuIsa::Neon, CpuIsa::Portable})
    if (supports(i)) v.push_back(cpu_isa_name(i));
  return v;
}

std::vector<std::string> cpu_isa_features() {
  std::vector<std::string> v;
  if (isa_vnni()) v.push_back("vnni");
  if (isa_dotprod()) v.push_back("dotprod");
  return v;
}

void set_cpu_isa(const std::string& name) {
  CpuIsa i = parse(name, "set_cpu_isa");
  std::lock_guard<std::mutex> l(choose_mu);
  store(i);
}

}  // namespace luminal
