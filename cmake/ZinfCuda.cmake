# Detects the CUDA toolkit and NCCL. ZINF_WITH_CUDA / ZINF_WITH_NCCL default
# to ON when found; set ON explicitly with the piece missing is a configure
# error naming it, never a quietly smaller build.

set(_zinf_nvcc "")
if(DEFINED CMAKE_CUDA_COMPILER)
  # The user chose a compiler: use it or fail, never look elsewhere.
  set(_zinf_nvcc_searched "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}")
  if(EXISTS "${CMAKE_CUDA_COMPILER}")
    set(_zinf_nvcc "${CMAKE_CUDA_COMPILER}")
  endif()
else()
  set(_zinf_nvcc_searched "nvcc in PATH, \$CUDA_HOME/bin, \$CUDA_PATH/bin and /usr/local/cuda/bin")
  find_program(ZINF_NVCC_EXECUTABLE nvcc
    HINTS ENV CUDA_HOME ENV CUDA_PATH
    PATH_SUFFIXES bin
    PATHS /usr/local/cuda/bin)
  if(ZINF_NVCC_EXECUTABLE)
    set(_zinf_nvcc "${ZINF_NVCC_EXECUTABLE}")
  endif()
endif()

if(_zinf_nvcc)
  set(_zinf_cuda_default ON)
else()
  set(_zinf_cuda_default OFF)
endif()
option(ZINF_WITH_CUDA "Build the CUDA device, kernels and GPU tests" ${_zinf_cuda_default})

if(ZINF_WITH_CUDA)
  if(NOT _zinf_nvcc)
    message(FATAL_ERROR
      "ZINF_WITH_CUDA=ON but no CUDA compiler was found (looked for ${_zinf_nvcc_searched}). "
      "Install the CUDA Toolkit, point -DCMAKE_CUDA_COMPILER at nvcc, or configure with -DZINF_WITH_CUDA=OFF.")
  endif()
  set(CMAKE_CUDA_COMPILER "${_zinf_nvcc}")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 has no C++20 dialect flag for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  get_filename_component(_zinf_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(_zinf_cuda_root "${_zinf_cuda_bin}" DIRECTORY)
  find_package(CUDAToolkit REQUIRED)
  if(NOT TARGET CUDA::cublas)
    message(FATAL_ERROR "ZINF_WITH_CUDA=ON but cuBLAS was not found in ${CUDAToolkit_LIBRARY_DIR}.")
  endif()
endif()

# NCCL: beside the toolkit, or where NCCL_ROOT / NCCL_HOME points.
set(_zinf_nccl_found OFF)
if(ZINF_WITH_CUDA)
  find_path(ZINF_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  find_library(ZINF_NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
  if(ZINF_NCCL_INCLUDE_DIR AND ZINF_NCCL_LIBRARY)
    set(_zinf_nccl_found ON)
  endif()
endif()
option(ZINF_WITH_NCCL "Build the NCCL communicator (needs ZINF_WITH_CUDA)" ${_zinf_nccl_found})
if(ZINF_WITH_NCCL)
  if(NOT ZINF_WITH_CUDA)
    message(FATAL_ERROR "ZINF_WITH_NCCL=ON needs ZINF_WITH_CUDA=ON (NCCL communicates CUDA buffers).")
  endif()
  if(NOT _zinf_nccl_found)
    message(FATAL_ERROR
      "ZINF_WITH_NCCL=ON but NCCL was not found (nccl.h: ${ZINF_NCCL_INCLUDE_DIR}, libnccl: ${ZINF_NCCL_LIBRARY}). "
      "Set -DNCCL_ROOT=/path/to/nccl or configure with -DZINF_WITH_NCCL=OFF.")
  endif()
  add_library(zinf_nccl INTERFACE)
  target_include_directories(zinf_nccl INTERFACE "${ZINF_NCCL_INCLUDE_DIR}")
  target_link_libraries(zinf_nccl INTERFACE "${ZINF_NCCL_LIBRARY}")
endif()
