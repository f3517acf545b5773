# The Debian-packaged dependencies (scripts/setup installs them). All are
# required: find_package where the package ships a CMake config, pkg-config
# where it ships a .pc file. Nothing is vendored or downloaded.

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

find_package(TBB REQUIRED)              # libtbb-dev
find_package(xtl REQUIRED)              # xtl-dev (Debian's xsimd target links it)
find_package(xsimd REQUIRED)            # libxsimd-dev
find_package(spdlog REQUIRED)           # libspdlog-dev
find_package(nlohmann_json 3.10 REQUIRED)  # nlohmann-json3-dev
find_package(CLI11 REQUIRED)            # libcli11-dev
find_package(benchmark REQUIRED)        # libbenchmark-dev
find_package(MPI REQUIRED COMPONENTS C) # libopenmpi-dev
# zinf uses MPI's C API only; keep <mpi.h> from dragging in the deprecated C++
# bindings (Open MPI) or MPICH's equivalent.
target_compile_definitions(MPI::MPI_C INTERFACE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)   # liburing-dev
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)      # libhwloc-dev
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash) # libxxhash-dev
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas) # libopenblas-dev
if(ZINF_BUILD_TESTS)
  find_package(GTest REQUIRED)          # libgtest-dev, libgmock-dev
endif()
