# What `cmake --install` puts in a prefix for out-of-tree consumers:
#   include/zinf/zinf.h                      the C ABI (the only public header installed)
#   <libdir>/libzinf.so.<abi>[.x.y.z]        zinf_shared (src/capi), SONAME libzinf.so.<abi>
#   <libdir>/cmake/zinf/zinfConfig*.cmake    find_package(zinf) -> zinf::zinf
#   <libdir>/pkgconfig/zinf.pc               pkg-config --cflags --libs zinf
#   <libdir>/libzinf.a                       with -DZINF_BUILD_STATIC=ON: zinf::zinf_static
#   <libdir>/pkgconfig/zinf-static.pc        and pkg-config --libs zinf-static
# The C++ headers of include/zinf/ stay in the tree: their classes are hidden
# in libzinf.so, so only code built inside zinf (linking the static library)
# can use them. Components: zinf_runtime (the library), zinf_dev (the rest).
include(CMakePackageConfigHelpers)

set(ZINF_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/zinf" CACHE STRING
    "Where zinfConfig.cmake is installed, relative to the prefix")

install(TARGETS zinf_shared EXPORT zinfTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT zinf_runtime NAMELINK_COMPONENT zinf_dev
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT zinf_runtime
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT zinf_dev)
if(ZINF_BUILD_STATIC)
  install(TARGETS zinf_static EXPORT zinfTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT zinf_dev)
endif()
install(FILES "${PROJECT_SOURCE_DIR}/include/zinf/zinf.h"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/zinf" COMPONENT zinf_dev)
install(EXPORT zinfTargets
  NAMESPACE zinf::
  FILE zinfTargets.cmake
  DESTINATION "${ZINF_INSTALL_CMAKEDIR}" COMPONENT zinf_dev)

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/zinfConfig.cmake.in"
  "${CMAKE_BINARY_DIR}/package/zinfConfig.cmake"
  INSTALL_DESTINATION "${ZINF_INSTALL_CMAKEDIR}")
# 0.x: a new minor version may break the API (the SONAME says whether the ABI did).
write_basic_package_version_file("${CMAKE_BINARY_DIR}/package/zinfConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/package/zinfConfig.cmake" "${CMAKE_BINARY_DIR}/package/zinfConfigVersion.cmake"
  DESTINATION "${ZINF_INSTALL_CMAKEDIR}" COMPONENT zinf_dev)

# zinf.pc is relocatable: its prefix is found from the .pc file's own place
# (${pcfiledir}), so `cmake --install --prefix <anywhere>` gives a working file.
set(_zinf_pcdir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ZINF_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _zinf_up "/zinf-prefix/${_zinf_pcdir}" "/zinf-prefix")
  string(REGEX REPLACE "/$" "" _zinf_up "${_zinf_up}")
  set(ZINF_PC_PREFIX "\${pcfiledir}/${_zinf_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ZINF_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(ZINF_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ZINF_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(ZINF_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${CMAKE_CURRENT_LIST_DIR}/zinf.pc.in" "${CMAKE_BINARY_DIR}/package/zinf.pc" @ONLY)
install(FILES "${CMAKE_BINARY_DIR}/package/zinf.pc" DESTINATION "${_zinf_pcdir}" COMPONENT zinf_dev)
if(ZINF_BUILD_STATIC)
  list(JOIN ZINF_STATIC_LINK_ITEMS " " ZINF_PC_STATIC_LIBS)
  configure_file("${CMAKE_CURRENT_LIST_DIR}/zinf-static.pc.in" "${CMAKE_BINARY_DIR}/package/zinf-static.pc" @ONLY)
  install(FILES "${CMAKE_BINARY_DIR}/package/zinf-static.pc" DESTINATION "${_zinf_pcdir}" COMPONENT zinf_dev)
endif()
