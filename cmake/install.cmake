# `cmake --install`: the libraries, the public headers under <prefix>/include/evenflow, the package
# config for find_package(evenflow) with targets evenflow::evenflow and evenflow::<component>, and
# evenflow.pc for pkg-config. Included by the root CMakeLists.txt once the library targets exist.
include(CMakePackageConfigHelpers)
set(EF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/evenflow)

set(ef_installed_targets ef_evenflow)
foreach(component IN LISTS EF_COMPONENTS)
  list(APPEND ef_installed_targets ef_${component})
  # The public headers of each source folder (include/evenflow/<component> links to them in the tree):
  # every header of the folder (not its subfolders) but the *_internal.h ones.
  file(GLOB ef_component_headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${component}/*.h)
  list(FILTER ef_component_headers EXCLUDE REGEX "${EF_INTERNAL_HEADER_REGEX}")
  list(TRANSFORM ef_component_headers PREPEND ${PROJECT_SOURCE_DIR}/)
  install(FILES ${ef_component_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/evenflow/${component})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/include/evenflow/evenflow.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/evenflow)
install(TARGETS ${ef_installed_targets} EXPORT evenflowTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT evenflowTargets NAMESPACE evenflow:: DESTINATION ${EF_CMAKE_DIR})
# oneDNN beside the libraries that load it (under its soname; they find it through $ORIGIN).
if(EF_HAS_ONEDNN AND EF_SHARED)
  get_filename_component(ef_onednn_file ${EF_ONEDNN_LIB} REALPATH)
  install(FILES ${ef_onednn_file} DESTINATION ${CMAKE_INSTALL_LIBDIR} RENAME libdnnl.so.${ef_onednn_major})
endif()

# Static archives carry their private dependencies to the consumer's link: the config finds them.
# Shared libraries keep them to themselves.
set(EF_FIND_DEPENDENCIES "find_dependency(Threads)")
if(NOT EF_SHARED)
  string(APPEND EF_FIND_DEPENDENCIES "\nfind_dependency(ZLIB)\nfind_dependency(nlohmann_json)")
  if(EF_OPENMP)
    string(APPEND EF_FIND_DEPENDENCIES "\nfind_dependency(OpenMP COMPONENTS CXX)")
  endif()
  if(EF_HAS_CUDA)
    string(APPEND EF_FIND_DEPENDENCIES "\nfind_dependency(CUDAToolkit)")
  endif()
  if(EF_HAS_MPI)
    string(APPEND EF_FIND_DEPENDENCIES "\nset(MPI_CXX_SKIP_MPICXX ON)\nfind_dependency(MPI COMPONENTS CXX)")
  endif()
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/evenflowConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/evenflowConfig.cmake INSTALL_DESTINATION ${EF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/evenflowConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/evenflowConfig.cmake ${PROJECT_BINARY_DIR}/evenflowConfigVersion.cmake
        DESTINATION ${EF_CMAKE_DIR})

# pkg-config: the libraries in link order (each after those that use it).
set(EF_PC_LIBS "")
foreach(component parallel losses io data optim layers engine)
  string(APPEND EF_PC_LIBS " -levenflow_${component}")
endforeach()
file(RELATIVE_PATH EF_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)  # ../.. for lib/
configure_file(${PROJECT_SOURCE_DIR}/cmake/evenflow.pc.in ${PROJECT_BINARY_DIR}/evenflow.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/evenflow.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
