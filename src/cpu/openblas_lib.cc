#include "cpu/openblas_lib.h"

#include <dlfcn.h>

#include <string>

#include "common/check.h"

namespace zinf {
namespace {

template <typename Fn>
Status Resolve(void* handle, const std::string& library, const char* symbol, Fn& fn) {
  dlerror();
  void* p = dlsym(handle, symbol);
  if (!p) {
    const char* why = dlerror();
    return NotFound("OpenBLAS: " + library + " has no symbol " + symbol + ": " + (why ? why : "null"));
  }
  fn = reinterpret_cast<Fn>(p);
  return Status::Ok();
}

Result<OpenBlasLib> Open() {
  const char* soname = "libopenblas.so.0";
  std::string tried, opened;
  void* handle = nullptr;
#ifdef ZINF_OPENBLAS_DIR
  opened = std::string(ZINF_OPENBLAS_DIR) + "/" + soname;  // the OpenBLAS zinf was built against
  handle = dlopen(opened.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) tried = opened + " (" + dlerror() + ")";
#endif
  if (!handle) {
    opened = soname;
    handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!handle) tried += (tried.empty() ? "" : ", ") + std::string(soname) + " (" + dlerror() + ")";
  }
  if (!handle) {
    return NotFound("OpenBLAS could not be loaded (the model's matrix products need it): tried " + tried +
                    "; install libopenblas0-pthread (Debian) or put its directory in LD_LIBRARY_PATH");
  }
  // Open for the life of the process.
  OpenBlasLib lib;
  ZINF_RETURN_IF_ERROR(Resolve(handle, opened, "cblas_sgemm", lib.sgemm));
  ZINF_RETURN_IF_ERROR(Resolve(handle, opened, "cblas_dgemm", lib.dgemm));
  ZINF_RETURN_IF_ERROR(Resolve(handle, opened, "openblas_set_num_threads", lib.set_num_threads));
  ZINF_RETURN_IF_ERROR(Resolve(handle, opened, "openblas_get_num_threads", lib.get_num_threads));
  ZINF_RETURN_IF_ERROR(Resolve(handle, opened, "openblas_get_config", lib.get_config));
  return lib;
}

}  // namespace

Result<const OpenBlasLib*> OpenBlas() {
  static const Result<OpenBlasLib> loaded = Open();  // once per process, thread-safe
  if (!loaded.ok()) return loaded.status();
  return &loaded.value();
}

const OpenBlasLib& OpenBlasOrDie() {
  Result<const OpenBlasLib*> lib = OpenBlas();
  ZINF_CHECK_MSG(lib.ok(), lib.status().ToString().c_str());
  return **lib;
}

}  // namespace zinf
