// A shared library opened at run time (dlopen) and kept open for the life of
// the process. zinf opens the large numeric libraries (cuBLAS, OpenBLAS)
// this way on first use instead of linking them, so a process that never
// multiplies matrices does not pay their load time and memory.
//
//   ZINF_ASSIGN_OR_RETURN(SharedLibrary lib,
//                         SharedLibrary::Open("OpenBLAS", {dir + "/libopenblas.so.0", "libopenblas.so.0"},
//                                             "the model's matrix products need it", "install ..."));
//   ZINF_RETURN_IF_ERROR(lib.Resolve("cblas_sgemm", sgemm));
//
// Thread-safe (dlopen and dlsym are).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

class SharedLibrary {
 public:
  // Opens the first of `candidates` (a path, or a bare soname for the
  // loader's search) that loads. NotFound otherwise: "<what> could not be
  // loaded (<needed_for>): tried A (reason), B (reason); <remedy>".
  static Result<SharedLibrary> Open(std::string_view what, const std::vector<std::string>& candidates,
                                    std::string_view needed_for, std::string_view remedy);

  const std::string& path() const { return path_; }  // the candidate that opened

  // `fn` = the address of `symbol`, or NotFound naming the library, the
  // symbol and the loader's reason.
  template <typename Fn>
  Status Resolve(const char* symbol, Fn& fn) const {
    void* p = nullptr;
    ZINF_RETURN_IF_ERROR(Lookup(symbol, &p));
    fn = reinterpret_cast<Fn>(p);
    return Status::Ok();
  }

 private:
  Status Lookup(const char* symbol, void** p) const;

  std::string what_, path_;
  void* handle_ = nullptr;  // never closed
};

}  // namespace zinf
