#include "gpu/cublas_lib.h"

#include <dlfcn.h>

#include <string>

namespace zinf::gpu {
namespace {

#define ZINF_CUBLAS_STR2(x) #x
#define ZINF_CUBLAS_STR(x) ZINF_CUBLAS_STR2(x)  // expands cublasCreate to "cublasCreate_v2"

// The declared signatures match the library's (sizeof: unevaluated, no link).
static_assert(sizeof(static_cast<CublasLib::GemmExFn>(&::cublasGemmEx)) > 0);
static_assert(sizeof(static_cast<CublasLib::GemmStridedBatchedExFn>(&::cublasGemmStridedBatchedEx)) > 0);

template <typename Fn>
Status Resolve(void* handle, const char* library, const char* symbol, Fn& fn) {
  dlerror();
  void* p = dlsym(handle, symbol);
  if (!p) {
    const char* why = dlerror();
    return NotFound(std::string("cuBLAS: ") + library + " has no symbol " + symbol + ": " + (why ? why : "null"));
  }
  fn = reinterpret_cast<Fn>(p);
  return Status::Ok();
}

Result<CublasLib> Open() {
  const std::string soname = "libcublas.so." ZINF_CUBLAS_STR(CUBLAS_VER_MAJOR);
  std::string tried;
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string opened = soname;
  if (!handle) {
    tried = soname + " (" + dlerror() + ")";
#ifdef ZINF_CUDA_LIBRARY_DIR
    opened = std::string(ZINF_CUDA_LIBRARY_DIR) + "/" + soname;
    handle = dlopen(opened.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) tried += ", " + opened + " (" + dlerror() + ")";
#endif
  }
  if (!handle) {
    return NotFound("cuBLAS could not be loaded (needed by the CUDA model): tried " + tried +
                    "; install the CUDA Toolkit's cuBLAS or put its directory in LD_LIBRARY_PATH");
  }
  // The handle stays open for the life of the process: cuBLAS handles outlive any one model.
  CublasLib lib;
  const char* name = opened.c_str();
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasCreate), lib.create));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasDestroy), lib.destroy));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasSetStream), lib.set_stream));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasSetMathMode), lib.set_math_mode));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasSgemm), lib.sgemm));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasSgemmStridedBatched), lib.sgemm_strided_batched));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasGemmEx), lib.gemm_ex));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasGemmStridedBatchedEx), lib.gemm_strided_batched_ex));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasGetStatusName), lib.status_name));
  ZINF_RETURN_IF_ERROR(Resolve(handle, name, ZINF_CUBLAS_STR(cublasGetStatusString), lib.status_string));
  return lib;
}

}  // namespace

Result<const CublasLib*> Cublas() {
  static const Result<CublasLib> loaded = Open();  // once per process, thread-safe
  if (!loaded.ok()) return loaded.status();
  return &loaded.value();
}

}  // namespace zinf::gpu
