// CPU-side library probes. None of them initializes MPI or spawns threads
// that outlive the call.
#include "cpu/host_info.h"

#include <hwloc.h>
#include <mpi.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/version.h>

#include <string>

#include "common/build_config.h"
#include "common/units.h"
#include "cpu/openblas_lib.h"
#include "cpu/simd_level.h"

namespace zinf::cpu {

BackendInfo ProbeTbb() {
  return {"oneTBB", true, true,
          std::string(TBB_runtime_version()) + " (built with " TBB_VERSION_STRING "), " +
              std::to_string(tbb::info::default_concurrency()) + " threads available"};
}

BackendInfo ProbeHwloc() {
  BackendInfo info{"hwloc", true, false, ""};
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
    info.detail = "topology could not be loaded";
    return info;
  }
  auto count = [&](hwloc_obj_type_t type) { return std::to_string(hwloc_get_nbobjs_by_type(topo, type)); };
  unsigned api = hwloc_get_api_version();
  info.usable = true;
  info.detail = "API " + std::to_string(api >> 16) + "." + std::to_string((api >> 8) & 0xff) + "." +
                std::to_string(api & 0xff) + ": " + count(HWLOC_OBJ_PACKAGE) + " package(s), " +
                count(HWLOC_OBJ_NUMANODE) + " NUMA node(s), " + count(HWLOC_OBJ_CORE) + " core(s), " +
                count(HWLOC_OBJ_PU) + " PU(s), " + FormatBytes(hwloc_get_root_obj(topo)->total_memory) + " memory";
  hwloc_topology_destroy(topo);
  return info;
}

BackendInfo ProbeSimd() {
  SimdLevel active = ActiveSimdLevel(), detected = DetectedSimdLevel();
  std::string detail = std::string(SimdLevelName(active));
  if (active != detected) detail += " (capped by ZINF_SIMD; CPU supports " + std::string(SimdLevelName(detected)) + ")";
  return {"simd", true, true, detail};
}

BackendInfo ProbeMpi() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);  // allowed before MPI_Init
  std::string v(version, static_cast<size_t>(len));
  if (auto comma = v.find(','); comma != std::string::npos) v.resize(comma);
  return {"mpi", true, true, v + " (used when started by mpirun)"};
}

BackendInfo ProbeOpenBlas() {
  Result<const OpenBlasLib*> blas = OpenBlas();  // opened here: zinf does not link it
  if (!blas.ok()) return {"openblas", true, false, blas.status().message()};
  std::string cfg = (*blas)->get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return {"openblas", true, true, cfg};
}

}  // namespace zinf::cpu
