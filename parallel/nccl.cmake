# NCCL for NcclCommunicator (nccl_communicator.cu, nccl_watchdog.cu), included by parallel/CMakeLists.txt after
# ef_parallel is defined. Needs the CUDA backend, nccl.h and libnccl. They are looked for first under
# EF_NCCL_ROOT (a cache or environment variable: for instance a PyTorch wheel's nvidia/nccl folder,
# which holds include/nccl.h and lib/libnccl.so.2 only), then next to the CUDA toolkit. Sets EF_NCCL
# to 1 or 0 for ef_parallel's sources.
set(EF_NCCL_ROOT "$ENV{EF_NCCL_ROOT}" CACHE PATH "Where to look first for NCCL (include/nccl.h, lib/libnccl.so)")

# A new root means a new search, not the cached result of the old one.
if(NOT "${EF_NCCL_ROOT}" STREQUAL "${EF_NCCL_ROOT_SEARCHED}")
  unset(EF_NCCL_INCLUDE CACHE)
  unset(EF_NCCL_LIB CACHE)
endif()
set(EF_NCCL_ROOT_SEARCHED "${EF_NCCL_ROOT}" CACHE INTERNAL "EF_NCCL_ROOT when EF_NCCL_INCLUDE and EF_NCCL_LIB were found")

set(EF_HAS_NCCL 0)
if(EF_HAS_CUDA)
  find_path(EF_NCCL_INCLUDE nccl.h
    HINTS ${EF_NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  # NAMES_PER_DIR: the library next to the header found above, not a libnccl.so further down the list.
  find_library(EF_NCCL_LIB NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${EF_NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES lib lib64)
  if(EF_NCCL_INCLUDE AND EF_NCCL_LIB)
    set(EF_HAS_NCCL 1)
  endif()
endif()

if(EF_HAS_NCCL)
  message(STATUS "evenflow: NCCL found: ${EF_NCCL_LIB} (nccl.h in ${EF_NCCL_INCLUDE})")
  target_sources(ef_parallel PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator.cu
                                     ${CMAKE_CURRENT_LIST_DIR}/nccl_watchdog.cu)
  # cuda_internal.h includes cudnn.h.
  target_include_directories(ef_parallel SYSTEM PRIVATE ${EF_NCCL_INCLUDE} ${EF_CUDNN_INCLUDE})
  target_link_libraries(ef_parallel PRIVATE ${EF_NCCL_LIB} CUDA::cudart)
  target_compile_options(ef_parallel PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
elseif(EF_HAS_CUDA)
  message(STATUS "evenflow: NCCL not found (set EF_NCCL_ROOT to its folder): distinct GPUs use the local communicator")
else()
  message(STATUS "evenflow: NCCL not used (no CUDA backend)")
endif()
target_compile_definitions(ef_parallel PRIVATE EF_NCCL=${EF_HAS_NCCL})
set(EF_HAS_NCCL ${EF_HAS_NCCL} PARENT_SCOPE)
