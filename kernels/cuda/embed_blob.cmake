# Writes a C file defining `${SYMBOL}` (the bytes of the files in the list
# ${INPUTS}, concatenated in list order) and `${SYMBOL}_len`.
# Run as: cmake "-DINPUTS=a;b;..." -DOUTPUT=... -DSYMBOL=... -P embed_blob.cmake
set(hex "")
foreach(f ${INPUTS})
  file(READ "${f}" h HEX)
  string(APPEND hex "${h}")
endforeach()
string(LENGTH "${hex}" n)
math(EXPR nbytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" body "${body}")
list(JOIN INPUTS ", " names)
file(WRITE "${OUTPUT}" "/* Generated from ${names}; do not edit. */\n#include <stddef.h>\n"
  "__attribute__((aligned(64))) const unsigned char ${SYMBOL}[] = {\n${body}\n};\n"
  "const size_t ${SYMBOL}_len = ${nbytes};\n")
