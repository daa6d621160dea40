# Ray's C++ API (PyPI ray[cpp], pinned: scripts/setup.sh --ray installs it in a venv) for
# preprocessing on a Ray cluster (data/ray_batches.h; the Ray side is data/ray/). Sets EF_HAS_RAY
# and EF_RAY_BIN (where the `ray` command is), and defines ef_add_ray_driver(), with which a program
# makes its task library and driver. Included before any library is defined: with Ray, everything is
# compiled position-independent, because the task library is a shared library made of evenflow's.
set(EF_RAY_VERSION 2.60.0)
set(EF_RAY_VENV "$ENV{HOME}/.cache/evenflow/ray-${EF_RAY_VERSION}" CACHE PATH
    "The venv with ray[cpp]==${EF_RAY_VERSION} (scripts/setup.sh --ray)")
set(EF_HAS_RAY 0)
if(NOT EF_RAY STREQUAL "OFF")
  file(GLOB ef_ray_cpp_dirs "${EF_RAY_VENV}/lib/python3*/site-packages/ray/cpp")
  list(LENGTH ef_ray_cpp_dirs ef_ray_found)
  if(ef_ray_found EQUAL 1 AND EXISTS "${ef_ray_cpp_dirs}/lib/libray_api.so")
    set(EF_HAS_RAY 1)
    set(EF_RAY_CPP "${ef_ray_cpp_dirs}")
    set(EF_RAY_BIN "${EF_RAY_VENV}/bin")
  elseif(EF_RAY STREQUAL "ON")
    message(FATAL_ERROR "EF_RAY=ON but ray[cpp] ${EF_RAY_VERSION} is not in ${EF_RAY_VENV} "
                        "(bash scripts/setup.sh --ray installs it; -DEF_RAY_VENV=... names another venv)")
  endif()
endif()
message(STATUS "evenflow: Ray ${EF_HAS_RAY}")
if(NOT EF_HAS_RAY)
  return()
endif()
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
# Position-independent code may not assume a function is the one it calls (another library could
# interpose it), which stops inlining across functions; nobody interposes evenflow's.
add_compile_options($<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-fno-semantic-interposition>)

# libray_api.so has no SONAME; it carries its own gRPC, protobuf, abseil and Boost (ray-cpp.md).
add_library(ef_ray_api SHARED IMPORTED GLOBAL)
set_target_properties(ef_ray_api PROPERTIES IMPORTED_LOCATION "${EF_RAY_CPP}/lib/libray_api.so"
  IMPORTED_NO_SONAME TRUE INTERFACE_INCLUDE_DIRECTORIES "${EF_RAY_CPP}/include")

# ef_add_ray_driver(<driver> <task library> <pipelines source> [LIBRARIES <libs>] [DEFAULT]): the
# task library (the source defines data::make_ray_pipeline, data/ray/make_pipeline.h) and the
# driver executable linked to it; DEFAULT: the driver RayBatches uses when RayOptions::driver is
# empty (the programs'). Workers load every library in the task library's folder: give each task
# library a folder of its own. Ray's files are compiled with the old string ABI
# (_GLIBCXX_USE_CXX11_ABI=0, as libray_api.so was: without it ray::Init crashes); nothing of the
# standard library crosses between them and the rest (worker.h).
function(ef_add_ray_driver driver tasks pipelines)
  cmake_parse_arguments(arg "DEFAULT" "" "LIBRARIES" ${ARGN})
  set(dir ${PROJECT_SOURCE_DIR}/data/ray)
  if(NOT TARGET ef_ray_worker)
    # The normal-ABI half of a task: the pipeline cache and make_batch behind a C boundary (worker.h).
    add_library(ef_ray_worker OBJECT ${dir}/worker.cpp)
    target_link_libraries(ef_ray_worker PRIVATE ef_data ef_options)
    add_library(ef_ray_task OBJECT ${dir}/task.cpp)
    target_compile_definitions(ef_ray_task PRIVATE _GLIBCXX_USE_CXX11_ABI=0)
    # Ray's headers (Boost, msgpack) are not warning-clean: included as system headers, without -Werror.
    target_include_directories(ef_ray_task SYSTEM PRIVATE ${EF_RAY_CPP}/include)
    target_include_directories(ef_ray_task PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
  add_library(${tasks} SHARED ${pipelines})
  target_link_libraries(${tasks} PRIVATE ef_ray_task ef_ray_worker ef_data ef_options ${arg_LIBRARIES} ef_ray_api)
  # Workers dlopen this library and look its tasks up by name: keep the link to libray_api.so even
  # though nothing here calls it directly, or registration finds no runtime (RayFunctionNotFound).
  target_link_options(${tasks} PRIVATE -Wl,--no-as-needed)

  add_executable(${driver} ${dir}/driver.cpp)
  target_compile_definitions(${driver} PRIVATE _GLIBCXX_USE_CXX11_ABI=0)
  target_include_directories(${driver} SYSTEM PRIVATE ${EF_RAY_CPP}/include)
  target_include_directories(${driver} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${driver} PRIVATE ${tasks} ef_ray_api)
  target_link_options(${driver} PRIVATE -Wl,--no-as-needed)
  if(arg_DEFAULT)
    target_compile_definitions(ef_data PRIVATE EF_RAY_DRIVER="$<TARGET_FILE:${driver}>")
  endif()
endfunction()
