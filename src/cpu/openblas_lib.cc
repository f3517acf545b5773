#include "cpu/openblas_lib.h"

#include <string>
#include <vector>

#include "common/check.h"
#include "common/shared_library.h"

namespace zinf::cpu {
namespace {

Result<OpenBlasLib> Open() {
  const std::string soname = "libopenblas.so.0";
  std::vector<std::string> candidates;
#ifdef ZINF_OPENBLAS_DIR
  candidates.push_back(std::string(ZINF_OPENBLAS_DIR) + "/" + soname);  // the OpenBLAS zinf was built against
#endif
  candidates.push_back(soname);
  // Open for the life of the process.
  ZINF_ASSIGN_OR_RETURN(SharedLibrary so,
                        SharedLibrary::Open("OpenBLAS", candidates, "the model's matrix products need it",
                                            "install libopenblas0-pthread (Debian) or put its directory in "
                                            "LD_LIBRARY_PATH"));
  OpenBlasLib lib;
  ZINF_RETURN_IF_ERROR(so.Resolve("cblas_sgemm", lib.sgemm));
  ZINF_RETURN_IF_ERROR(so.Resolve("cblas_dgemm", lib.dgemm));
  ZINF_RETURN_IF_ERROR(so.Resolve("openblas_set_num_threads", lib.set_num_threads));
  ZINF_RETURN_IF_ERROR(so.Resolve("openblas_get_num_threads", lib.get_num_threads));
  ZINF_RETURN_IF_ERROR(so.Resolve("openblas_get_config", lib.get_config));
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

}  // namespace zinf::cpu
