# Install-time step of cmake/MbdInstall.cmake: writes the systemd units from
# deploy/systemd/*.service.in with the paths of the prefix being installed to.
# GNUInstallDirs' rule for sysconfdir: /etc for the /usr prefix, else <prefix>/etc.
function(mbd_full out rel)
  if(IS_ABSOLUTE "${rel}")
    set(${out} "${rel}" PARENT_SCOPE)
  elseif(rel STREQUAL "etc" AND CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(${out} "/etc" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${rel}" PARENT_SCOPE)
  endif()
endfunction()
mbd_full(MBD_BINDIR "${MBD_REL_BINDIR}")
mbd_full(MBD_SYSCONFDIR "${MBD_REL_SYSCONFDIR}")
set(MBD_SYSCONFDIR "${MBD_SYSCONFDIR}/mambad")
mbd_full(MBD_DOCDIR "${MBD_REL_DOCDIR}")
foreach(u ${MBD_UNITS})
  configure_file(${MBD_UNIT_SRC}/${u}.service.in ${MBD_UNIT_OUT}/${u}.service @ONLY)
endforeach()
