#include "common/shared_library.h"

#include <dlfcn.h>

namespace zinf {

Result<SharedLibrary> SharedLibrary::Open(std::string_view what, const std::vector<std::string>& candidates,
                                          std::string_view needed_for, std::string_view remedy) {
  std::string tried;
  for (const std::string& c : candidates) {
    if (void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      SharedLibrary lib;
      lib.what_ = what;
      lib.path_ = c;
      lib.handle_ = handle;
      return lib;
    }
    const char* why = dlerror();
    tried += (tried.empty() ? "" : ", ") + c + " (" + (why ? why : "no reason given") + ")";
  }
  return NotFound(std::string(what) + " could not be loaded (" + std::string(needed_for) + "): tried " +
                  (tried.empty() ? "nothing" : tried) + "; " + std::string(remedy));
}

Status SharedLibrary::Lookup(const char* symbol, void** p) const {
  dlerror();
  *p = dlsym(handle_, symbol);
  if (*p == nullptr) {
    const char* why = dlerror();
    return NotFound(what_ + ": " + path_ + " has no symbol " + symbol + ": " + (why ? why : "its address is null"));
  }
  return Status::Ok();
}

}  // namespace zinf
