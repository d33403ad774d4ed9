# The installed mambad.h: client/mambad.h with the common/ headers it includes
# (status, tensor, route) inlined in dependency order, so a program outside this
# tree needs only <mambad.h>. In-tree code keeps including "client/mambad.h".
# Also writes the linker version script that exports exactly the functions the
# installed header declares (libmambad's ABI), under the version node MAMBAD_<SOVERSION>.
#   mbd_public_header(HEADER out.h MAP out.map SOVERSION n)
function(mbd_public_header)
  cmake_parse_arguments(P "" "HEADER;MAP;SOVERSION" "" ${ARGN})
  set(parts common/status.h common/tensor.h common/route.h client/mambad.h)
  list(JOIN parts ", " part_names)
  string(CONCAT text "/* mambad.h: the public C API of libmambad ${PROJECT_VERSION}, generated from the\n"
           " * mambad sources (${part_names}). */\n"
           "#ifndef MAMBAD_PUBLIC_H\n#define MAMBAD_PUBLIC_H\n\n"
           "#define MAMBAD_VERSION \"${PROJECT_VERSION}\"\n"
           "#define MAMBAD_VERSION_MAJOR ${PROJECT_VERSION_MAJOR}\n"
           "#define MAMBAD_VERSION_MINOR ${PROJECT_VERSION_MINOR}\n"
           "#define MAMBAD_VERSION_PATCH ${PROJECT_VERSION_PATCH}\n\n"
           "#ifdef __cplusplus\nextern \"C\" {\n#endif\n")
  foreach(p ${parts})
    set(src ${PROJECT_SOURCE_DIR}/${p})
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
    file(READ ${src} body)
    # Every project include must be one of the inlined parts: anything else would
    # leave the installed header needing a file that is not installed.
    string(REGEX MATCHALL "#include \"[^\"]+\"" incs "${body}")
    foreach(inc ${incs})
      string(REGEX REPLACE "#include \"([^\"]+)\"" "\\1" dep "${inc}")
      if(NOT dep IN_LIST parts)
        message(FATAL_ERROR "${p} includes ${dep}, which the installed mambad.h does not inline: "
                            "add it to the parts in cmake/MbdPublicHeader.cmake")
      endif()
    endforeach()
    string(REGEX REPLACE "#include \"[^\"]+\"\n" "" body "${body}")
    # extern "C" wraps the whole file once.
    string(REGEX REPLACE "#ifdef __cplusplus\nextern \"C\" {\n#endif\n" "" body "${body}")
    string(REGEX REPLACE "#ifdef __cplusplus\n}\n#endif\n" "" body "${body}")
    string(APPEND text "\n/* ---- ${p} ---- */\n${body}")
  endforeach()
  string(APPEND text "\n#ifdef __cplusplus\n}\n#endif\n\n#endif\n")
  file(CONFIGURE OUTPUT ${P_HEADER} CONTENT "${text}" @ONLY)

  # Declared functions: an identifier followed by "(" at the start of a
  # declaration ("int mbd_x(", "const char *mbd_y(").
  string(REGEX MATCHALL "[ *](mbd_[a-z0-9_]+)\\(" decls "${text}")
  set(names "")
  foreach(d ${decls})
    string(REGEX REPLACE "[ *](mbd_[a-z0-9_]+)\\(" "\\1" n "${d}")
    list(APPEND names ${n})
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(SORT names)
  list(JOIN names ";\n    " syms)
  file(CONFIGURE OUTPUT ${P_MAP} CONTENT
       "MAMBAD_${P_SOVERSION} {\n  global:\n    ${syms};\n  local:\n    *;\n};\n" @ONLY)
endfunction()
