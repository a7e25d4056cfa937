// Which instruction set the CPU kernels use: one level, chosen once at load from CPUID (x86-64) or HWCAP (aarch64),
// or forced with LUMINAL_CPU_ISA=avx2|avx512|neon|portable. Every kernel family dispatches on cpu_isa().
//   portable  plain C++ (any CPU)
//   avx2      AVX2 + FMA + F16C
//   avx512    the above + AVX-512 F/VL/BW/DQ; the int8 dot products use VNNI (vpdpbusd) where the CPU has it
//   neon      AArch64 Advanced SIMD; the int8 dot products use sdot (vdotq_s32) where the CPU has dotprod
#pragma once
#include <atomic>
#include <string>
#include <vector>

namespace luminal {

enum class CpuIsa : int { Portable = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };

namespace isa_detail {
extern std::atomic<int> current;  // -1 until chosen
int choose();                     // picks (throws on a bad LUMINAL_CPU_ISA) and stores the level
extern bool vnni, dotprod;        // the optional extensions, valid once chosen
}  // namespace isa_detail

// The level in use. One relaxed load on the hot path once chosen.
inline CpuIsa cpu_isa() {
  int v = isa_detail::current.load(std::memory_order_relaxed);
  return CpuIsa(v >= 0 ? v : isa_detail::choose());
}
// x86 kernels of at least this level may run.
inline bool isa_at_least_avx2() { CpuIsa i = cpu_isa(); return i == CpuIsa::Avx2 || i == CpuIsa::Avx512; }
inline bool isa_avx512() { return cpu_isa() == CpuIsa::Avx512; }
inline bool isa_neon() { return cpu_isa() == CpuIsa::Neon; }
// AVX-512 VNNI / NEON dotprod in use (the level's optional int8 dot-product instruction).
inline bool isa_vnni() { return isa_avx512() && isa_detail::vnni; }
inline bool isa_dotprod() { return isa_neon() && isa_detail::dotprod; }

const char* cpu_isa_name(CpuIsa i);
// The levels this CPU can run, best first (always ending with "portable").
std::vector<std::string> supported_cpu_isas();
// The optional extensions the chosen level uses ("vnni", "dotprod").
std::vector<std::string> cpu_isa_features();
// Switches the level (tests and benchmarks; never while kernels run). Throws std::invalid_argument naming the
// level and what the CPU supports where it is unknown or the CPU lacks it.
void set_cpu_isa(const std::string& name);

}  // namespace luminal
