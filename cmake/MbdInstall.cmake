# What `cmake --install` puts where (GNUInstallDirs paths), and the .deb CPack
# builds from it. Included after every component, so it sees all targets.
include(CMakePackageConfigHelpers)

# ---- programs ------------------------------------------------------------------
# `mambad <tool>` execs mambad-<tool> from its own directory, so they go together.
set(mbd_programs mambad_cli mambad-up mambad-broker mambad-worker mambad-run mambad-model
    mambad-gemm mambad-gateway)
# `cmake --build B --target mambad-installable` builds just what is installed
# (the container images build this, not the tests).
add_custom_target(mambad-installable)
add_dependencies(mambad-installable mambad)
foreach(t ${mbd_programs})
  if(TARGET ${t})
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    add_dependencies(mambad-installable ${t})
  endif()
endforeach()

# ---- libmambad: shared library, header, pkg-config, CMake package -------------
install(TARGETS mambad EXPORT mambadTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(mbd_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/mambad)
install(EXPORT mambadTargets NAMESPACE mambad:: DESTINATION ${mbd_cmakedir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mambadConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mambadConfig.cmake INSTALL_DESTINATION ${mbd_cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mambadConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mambadConfig.cmake ${PROJECT_BINARY_DIR}/mambadConfigVersion.cmake
        DESTINATION ${mbd_cmakedir})
# mambad.pc locates the prefix from its own directory (${pcfiledir}), so a
# tree installed with --prefix, DESTDIR or moved later still reads right.
file(RELATIVE_PATH MBD_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" MBD_PC_TO_PREFIX "${MBD_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/mambad.pc.in ${PROJECT_BINARY_DIR}/mambad.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mambad.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- systemd units, the service user, example deployments, docs ---------------
set(MBD_SYSTEMD_UNITDIR lib/systemd/system CACHE STRING
    "systemd unit directory, relative to the install prefix unless absolute")
set(mbd_units mambad mambad-broker mambad-worker@)
if(TARGET mambad-gateway)
  list(APPEND mbd_units mambad-gateway)
endif()
# Units name absolute paths, so they are written at install time, for the prefix
# actually installed to (`cmake --install --prefix`, CPack's /usr).
install(CODE "set(MBD_UNITS \"${mbd_units}\")
set(MBD_UNIT_SRC \"${PROJECT_SOURCE_DIR}/deploy/systemd\")
set(MBD_UNIT_OUT \"${PROJECT_BINARY_DIR}/systemd\")
set(MBD_REL_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
set(MBD_REL_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
set(MBD_REL_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")")
install(SCRIPT ${PROJECT_SOURCE_DIR}/cmake/MbdInstallUnits.cmake)
foreach(u ${mbd_units})
  install(FILES ${PROJECT_BINARY_DIR}/systemd/${u}.service DESTINATION ${MBD_SYSTEMD_UNITDIR})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/mambad.sysusers.conf
        DESTINATION lib/sysusers.d RENAME mambad.conf)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/local.yaml ${PROJECT_SOURCE_DIR}/deploy/local-gpu.yaml
              ${PROJECT_SOURCE_DIR}/deploy/multi-host.yaml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/k8s ${PROJECT_SOURCE_DIR}/deploy/docker
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING
        PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# ---- .deb (cpack -G DEB) ----------------------------------------------------------
# Depends: the Debian runtime packages of the libraries this build linked,
# named from the -dev packages found (msgpack's was renamed libmsgpack-c2).
function(mbd_deb_dep out)
  foreach(candidate ${ARGN})
    execute_process(COMMAND dpkg-query -W -f=\${Status} ${candidate} OUTPUT_VARIABLE st
                    ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND st MATCHES "install ok installed")
      set(${out} ${candidate} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  list(GET ARGN 0 first) # not installed here: the first name, as Debian 12 spells it
  set(${out} ${first} PARENT_SCOPE)
endfunction()
set(mbd_deb_deps "")
foreach(alts "libc6" "libzmq5" "libmsgpackc2;libmsgpack-c2" "libyaml-0-2" "libjansson4" "libpcre2-8-0"
        "libutf8proc2;libutf8proc3")
  mbd_deb_dep(d ${alts})
  list(APPEND mbd_deb_deps ${d})
endforeach()
if(TARGET mambad-gateway)
  mbd_deb_dep(d libmicrohttpd12 libmicrohttpd12t64)
  list(APPEND mbd_deb_deps ${d})
endif()
list(JOIN mbd_deb_deps ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
set(CPACK_PACKAGE_NAME mambad)
set(CPACK_PACKAGE_VENDOR mambad)
set(CPACK_PACKAGE_CONTACT "mambad maintainers <mambad@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Deterministic, batch-invariant Mamba serving (broker, workers, client)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr) # units and mambad.pc follow it (install time)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/systemd/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
