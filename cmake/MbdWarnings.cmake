# Strict warnings as errors for host C; optional ASan + UBSan.
add_compile_options(
  "$<$<COMPILE_LANGUAGE:C>:-Wall;-Wextra;-Werror;-Wshadow;-Wpointer-arith;-Wstrict-prototypes;-Wmissing-prototypes;-Wformat=2;-Wno-unused-parameter>")
add_compile_definitions(_GNU_SOURCE)
if(MBD_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-fsanitize=address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
endif()
