# The Python package's native parts, for a wheel built by scikit-build-core
# (pyproject.toml: `pip install .`, `pip wheel .`). Its build installs the
# component zinf_python only, into the wheel:
#   zinf/libzinf.so.<abi>            the C ABI zinf's Python front-end loads
#   zinf/_zinf_torch<EXT_SUFFIX>     zinf.torch's C++ core (where torch was found)
#   zinf/_zinf_torch.torch_version   the torch it was built against
#   <scripts>/zinf                   the command, on the environment's PATH
# The target zinf_python builds exactly these (pyproject's build.targets).
add_custom_target(zinf_python)
add_dependencies(zinf_python zinf_shared)
if(TARGET zinf_cli)
  add_dependencies(zinf_python zinf_cli)
endif()
if(TARGET zinf_torch_ext)
  add_dependencies(zinf_python zinf_torch_ext)
endif()
if(NOT SKBUILD)
  return()
endif()
# The library once, by its SONAME (a wheel holds no symbolic links), its
# debugging symbols stripped as install.strip does for targets.
install(FILES "$<TARGET_FILE:zinf_shared>" DESTINATION zinf RENAME "libzinf.so.${ZINF_ABI_VERSION}"
        COMPONENT zinf_python)
if(CMAKE_STRIP)
  install(CODE "execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug \"\${CMAKE_INSTALL_PREFIX}/zinf/libzinf.so.${ZINF_ABI_VERSION}\")"
          COMPONENT zinf_python)
endif()
if(TARGET zinf_cli)
  # The command finds CUDA's and MPI's libraries as the build tree's does.
  set_target_properties(zinf_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS zinf_cli RUNTIME DESTINATION "${SKBUILD_SCRIPTS_DIR}" COMPONENT zinf_python)
endif()
if(TARGET zinf_torch_ext)
  install(TARGETS zinf_torch_ext LIBRARY DESTINATION zinf COMPONENT zinf_python)
  install(FILES "${ZINF_TORCH_VERSION_FILE}" DESTINATION zinf COMPONENT zinf_python)
endif()
# A build tree shared with a wheel build (tests/python/wheel_install.sh)
# forgets it at its next configure: a plain `cmake --install` of it never
# installs the wheel's layout.
unset(SKBUILD CACHE)
