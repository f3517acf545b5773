#include "gpu/cublas_lib.h"

#include <string>
#include <vector>

#include "common/shared_library.h"

namespace zinf::gpu {
namespace {

#define ZINF_CUBLAS_STR2(x) #x
#define ZINF_CUBLAS_STR(x) ZINF_CUBLAS_STR2(x)  // expands cublasCreate to "cublasCreate_v2"

// The declared signatures match the library's (sizeof: unevaluated, no link).
static_assert(sizeof(static_cast<CublasLib::GemmExFn>(&::cublasGemmEx)) > 0);
static_assert(sizeof(static_cast<CublasLib::GemmStridedBatchedExFn>(&::cublasGemmStridedBatchedEx)) > 0);

// lib<name>.so.<the headers' major version>: the loader's search path
// first, then the toolkit's library directory found at build time. Kept
// open for the life of the process: handles outlive any one model.
Result<SharedLibrary> OpenCublasLibrary(const char* name, const char* what, const char* needed_by) {
  const std::string soname = std::string("lib") + name + ".so." ZINF_CUBLAS_STR(CUBLAS_VER_MAJOR);
  std::vector<std::string> candidates = {soname};
#ifdef ZINF_CUDA_LIBRARY_DIR
  candidates.push_back(std::string(ZINF_CUDA_LIBRARY_DIR) + "/" + soname);
#endif
  return SharedLibrary::Open(what, candidates, needed_by,
                             "install the CUDA Toolkit's cuBLAS or put its directory in LD_LIBRARY_PATH");
}

Result<CublasLib> Open() {
  ZINF_ASSIGN_OR_RETURN(SharedLibrary so, OpenCublasLibrary("cublas", "cuBLAS", "needed by the CUDA model"));
  CublasLib lib;
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasCreate), lib.create));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasDestroy), lib.destroy));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasSetStream), lib.set_stream));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasSetMathMode), lib.set_math_mode));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasSgemm), lib.sgemm));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasSgemmStridedBatched), lib.sgemm_strided_batched));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasGemmEx), lib.gemm_ex));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasGemmStridedBatchedEx), lib.gemm_strided_batched_ex));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasGetStatusName), lib.status_name));
  ZINF_RETURN_IF_ERROR(so.Resolve(ZINF_CUBLAS_STR(cublasGetStatusString), lib.status_string));
  return lib;
}

Result<CublasLtLib> OpenLt() {
  ZINF_ASSIGN_OR_RETURN(SharedLibrary so,
                        OpenCublasLibrary("cublasLt", "cuBLASLt", "needed by the CUDA model's fused products"));
  CublasLtLib lib;
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtCreate", lib.create));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtDestroy", lib.destroy));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulDescCreate", lib.desc_create));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulDescDestroy", lib.desc_destroy));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulDescSetAttribute", lib.desc_set));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatrixLayoutCreate", lib.layout_create));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatrixLayoutDestroy", lib.layout_destroy));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulPreferenceCreate", lib.pref_create));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulPreferenceDestroy", lib.pref_destroy));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulPreferenceSetAttribute", lib.pref_set));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmulAlgoGetHeuristic", lib.heuristic));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtMatmul", lib.matmul));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtGetStatusName", lib.status_name));
  ZINF_RETURN_IF_ERROR(so.Resolve("cublasLtGetStatusString", lib.status_string));
  return lib;
}

}  // namespace

Result<const CublasLib*> Cublas() {
  static const Result<CublasLib> loaded = Open();  // once per process, thread-safe
  if (!loaded.ok()) return loaded.status();
  return &loaded.value();
}

Result<const CublasLtLib*> CublasLt() {
  static const Result<CublasLtLib> loaded = OpenLt();
  if (!loaded.ok()) return loaded.status();
  return &loaded.value();
}

}  // namespace zinf::gpu
