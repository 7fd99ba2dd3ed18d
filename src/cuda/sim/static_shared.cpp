// The static __shared__ variables a kernel can reach: the engine refills them with NaN
// bytes at every block start and the race check watches them (block.cpp, race.cpp).
// cuda_runtime.h puts every static __shared__ variable in the section lns_sim_shared,
// but a block of kernel K needs only K's: refilling the whole section (15.6 KiB in
// lns_gpu_tests) at every block, and comparing it after every fiber slice, was most of
// an ASan test's time under the race check.
//
// A function-local static of function F is the symbol `_ZZ<F's mangled name without
// _Z>E<its name>`; K's name comes from the executable's symbol table by the address
// every launch passes, and the non-template kernels are the functions in the section
// lns_sim_kernels (cuda_runtime.h's __global__). K's stretches are then:
// - its own locals, in the section or not: GCC (12) drops the section attribute of a
//   static inside a function template (GCC PR 70435), so `__shared__ float red[32]` in
//   norm_forward_kernel<W, kLayerNorm> lands in .bss (found by the race check with
//   reads: a barrier deliberately removed from block_sum went unreported);
// - every other variable of the section but the locals of other kernels: a
//   function-local static is reachable from its own function only, and a kernel runs
//   only as its own grid. The locals of __device__ helpers and variables at namespace
//   scope go with every kernel. (A static __shared__ inside a *template* helper would
//   land in .bss under no kernel's name: unwatched. There is none.)
// Without a symbol table (a stripped binary) every kernel gets the whole section.
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/sim/sim_internal.h"

extern "C" {
extern char __start_lns_sim_shared[] __attribute__((weak));
extern char __stop_lns_sim_shared[] __attribute__((weak));
extern char __start_lns_sim_kernels[] __attribute__((weak));
extern char __stop_lns_sim_kernels[] __attribute__((weak));
}

namespace lns::sim {
namespace {

struct Symbols {
  std::unordered_map<uintptr_t, std::string> functions;  // runtime address -> mangled name
  std::vector<std::pair<std::string, SharedVar>> locals;  // "_ZZ..." writable objects outside the section, sorted
  std::vector<std::pair<std::string, SharedVar>> section;  // every object in the section
  std::vector<std::string> kernel_prefixes;                // "_ZZ<K without _Z>E" of each kernel in lns_sim_kernels
};

int main_bias(dl_phdr_info* info, size_t, void* data) {
  *static_cast<uintptr_t*>(data) = info->dlpi_addr;  // the first object is the program itself
  return 1;
}

bool read_at(int fd, void* out, size_t bytes, off_t offset) {
  char* p = static_cast<char*>(out);
  while (bytes) {
    const ssize_t n = pread(fd, p, bytes, offset);
    if (n <= 0) return false;
    p += n, bytes -= size_t(n), offset += n;
  }
  return true;
}

bool in_section(const char* p, const char* lo, const char* hi) { return lo && p >= lo && p < hi; }
bool in_shared(const char* p) { return in_section(p, __start_lns_sim_shared, __stop_lns_sim_shared); }

// The prefix of the local statics of function `mangled`; empty for a C name.
std::string locals_prefix(const std::string& mangled) {
  return mangled.size() > 2 && mangled.compare(0, 2, "_Z") == 0 ? "_ZZ" + mangled.substr(2) + "E" : "";
}

// The program's .symtab (our builds are not stripped). An unreadable or stripped
// binary gives an empty table: template kernels' variables then go unwatched.
Symbols load_symbols() {
  Symbols s;
  uintptr_t bias = 0;
  dl_iterate_phdr(main_bias, &bias);
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  Elf64_Ehdr eh;
  std::vector<Elf64_Shdr> sh;
  if (read_at(fd, &eh, sizeof eh, 0) && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_shentsize == sizeof(Elf64_Shdr) && eh.e_shnum > 0) {
    sh.resize(eh.e_shnum);
    if (!read_at(fd, sh.data(), sh.size() * sizeof(Elf64_Shdr), off_t(eh.e_shoff))) sh.clear();
  }
  for (const Elf64_Shdr& tab : sh) {
    if (tab.sh_type != SHT_SYMTAB || tab.sh_link >= sh.size() || tab.sh_entsize != sizeof(Elf64_Sym)) continue;
    const Elf64_Shdr& strs = sh[tab.sh_link];
    std::vector<Elf64_Sym> syms(tab.sh_size / sizeof(Elf64_Sym));
    std::vector<char> names(strs.sh_size + 1, '\0');
    if (!read_at(fd, syms.data(), syms.size() * sizeof(Elf64_Sym), off_t(tab.sh_offset)) ||
        !read_at(fd, names.data(), strs.sh_size, off_t(strs.sh_offset)))
      break;
    for (const Elf64_Sym& y : syms) {
      if (y.st_name >= strs.sh_size) continue;
      const char* name = names.data() + y.st_name;
      const int type = ELF64_ST_TYPE(y.st_info);
      if (type == STT_FUNC && y.st_value) {
        s.functions.emplace(bias + y.st_value, name);
        if (in_section(reinterpret_cast<const char*>(bias + y.st_value), __start_lns_sim_kernels,
                       __stop_lns_sim_kernels) &&
            !locals_prefix(name).empty())
          s.kernel_prefixes.push_back(locals_prefix(name));
      } else if (type == STT_OBJECT && y.st_shndx < sh.size() && (sh[y.st_shndx].sh_flags & SHF_WRITE) &&
                 y.st_size) {
        const SharedVar v{reinterpret_cast<char*>(bias + y.st_value), size_t(y.st_size), ""};
        if (in_shared(v.p))
          s.section.push_back({name, v});
        else if (std::strncmp(name, "_ZZ", 3) == 0)
          s.locals.push_back({name, v});
      }
    }
  }
  close(fd);
  std::sort(s.locals.begin(), s.locals.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return s;
}

// The source name of a function-local static: <length><name>[_<discriminator>] after
// the last `E` that such a suffix follows; the symbol itself for anything else.
std::string source_name(const std::string& symbol) {
  if (symbol.compare(0, 3, "_ZZ") != 0) return symbol;
  for (size_t e = symbol.rfind('E'); e != std::string::npos && e > 3; e = symbol.rfind('E', e - 1)) {
    const char* rest = symbol.c_str() + e + 1;
    char* end = nullptr;
    const long len = std::strtol(rest, &end, 10);
    if (end == rest || len <= 0 || size_t(len) > std::strlen(end)) continue;
    const char after = end[len];
    if (after == '\0' || after == '_') return std::string(end, size_t(len));
  }
  return symbol;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

std::shared_ptr<const std::vector<SharedVar>> kernel_static_shared(const void* func) {
  static std::mutex mu;
  static const Symbols syms = load_symbols();
  static std::map<const void*, std::shared_ptr<const std::vector<SharedVar>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& entry = cache[func];
  if (entry) return entry;
  const auto f = syms.functions.find(reinterpret_cast<uintptr_t>(func));
  const std::string prefix = f == syms.functions.end() ? "" : locals_prefix(f->second);  // empty: K has no name
  auto vars = std::make_shared<std::vector<SharedVar>>();
  const char* lo = __start_lns_sim_shared;
  const size_t section_bytes = lo ? size_t(__stop_lns_sim_shared - lo) : 0;
  if (syms.section.empty() && section_bytes)  // no symbols: all of it
    vars->push_back({__start_lns_sim_shared, section_bytes, ""});
  for (const auto& [name, v] : syms.section) {
    const bool own = !prefix.empty() && starts_with(name, prefix);
    bool another_kernels = false;
    for (const std::string& p : syms.kernel_prefixes) another_kernels |= p != prefix && starts_with(name, p);
    if (own || !another_kernels) vars->push_back({v.p, v.bytes, source_name(name)});
  }
  if (!prefix.empty()) {
    auto it = std::lower_bound(syms.locals.begin(), syms.locals.end(), prefix,
                               [](const auto& a, const std::string& p) { return a.first < p; });
    for (; it != syms.locals.end() && starts_with(it->first, prefix); ++it)
      vars->push_back({it->second.p, it->second.bytes, source_name(it->first)});
  }
  entry = std::move(vars);
  return entry;
}

}  // namespace lns::sim
