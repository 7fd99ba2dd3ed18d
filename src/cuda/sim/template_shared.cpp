// Static __shared__ variables of template kernels. cuda_runtime.h puts every static
// __shared__ variable in the section lns_sim_shared, which the engine refills with NaN
// bytes at each block start and the race check watches; but GCC (12) drops the section
// attribute of a function-local static inside a function template (GCC PR 70435), so
// `__shared__ float red[32]` in norm_forward_kernel<W, kLayerNorm> lands in .bss. This
// finds such variables by name: a function-local static of kernel K is the symbol
// `_ZZ<K's mangled name without _Z>E<its name>`, and K's own name comes from the
// executable's symbol table by the address every launch passes. Only writable data
// objects count (not __func__ strings). The symbol table is read once.
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/sim/sim_internal.h"

extern "C" {
extern char __start_lns_sim_shared[] __attribute__((weak));
extern char __stop_lns_sim_shared[] __attribute__((weak));
}

namespace lns::sim {
namespace {

struct Symbols {
  std::unordered_map<uintptr_t, std::string> functions;      // runtime address -> mangled name
  std::vector<std::pair<std::string, SharedVar>> locals;      // "_ZZ..." writable objects, sorted
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

// The program's .symtab (our builds are not stripped). An unreadable or stripped
// binary gives an empty table: template kernels then go unwatched, as before.
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
      } else if (type == STT_OBJECT && std::strncmp(name, "_ZZ", 3) == 0 && y.st_shndx < sh.size() &&
                 (sh[y.st_shndx].sh_flags & SHF_WRITE) && y.st_size) {
        s.locals.push_back({name, SharedVar{reinterpret_cast<char*>(bias + y.st_value), size_t(y.st_size), ""}});
      }
    }
  }
  close(fd);
  std::sort(s.locals.begin(), s.locals.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return s;
}

bool in_section(const char* p) { return __start_lns_sim_shared && p >= __start_lns_sim_shared && p < __stop_lns_sim_shared; }

}  // namespace

const std::vector<SharedVar>& template_static_shared(const void* func) {
  static std::mutex mu;
  static Symbols syms = load_symbols();
  static std::map<const void*, std::vector<SharedVar>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(func);
  if (!fresh) return it->second;
  const auto f = syms.functions.find(reinterpret_cast<uintptr_t>(func));
  if (f == syms.functions.end() || f->second.size() < 3 || f->second.compare(0, 2, "_Z") != 0) return it->second;
  const std::string prefix = "_ZZ" + f->second.substr(2) + "E";
  auto lo = std::lower_bound(syms.locals.begin(), syms.locals.end(), prefix,
                             [](const auto& a, const std::string& p) { return a.first < p; });
  for (; lo != syms.locals.end() && lo->first.compare(0, prefix.size(), prefix) == 0; ++lo) {
    if (in_section(lo->second.p)) continue;  // the section attribute held: already watched
    SharedVar v = lo->second;
    // <length><name>[_<discriminator>] after the prefix: the variable's source name
    const char* rest = lo->first.c_str() + prefix.size();
    char* end = nullptr;
    const long len = std::strtol(rest, &end, 10);
    v.name = len > 0 && size_t(len) <= std::strlen(end) ? std::string(end, size_t(len)) : lo->first;
    it->second.push_back(v);
  }
  return it->second;
}

}  // namespace lns::sim
