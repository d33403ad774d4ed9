# Writes a C file defining `${SYMBOL}` (the bytes of ${INPUT}, followed by those
# of ${INPUT2}, ${INPUT3} and ${INPUT4} when given) and `${SYMBOL}_len`.
# Run as: cmake -DINPUT=... [-DINPUT2=... ...] -DOUTPUT=... -DSYMBOL=... -P embed_blob.cmake
file(READ "${INPUT}" hex HEX)
foreach(more INPUT2 INPUT3 INPUT4)
  if(${more})
    file(READ "${${more}}" hex2 HEX)
    string(APPEND hex "${hex2}")
  endif()
endforeach()
string(LENGTH "${hex}" n)
math(EXPR nbytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" body "${body}")
file(WRITE "${OUTPUT}" "/* Generated from ${INPUT}; do not edit. */\n#include <stddef.h>\n"
  "__attribute__((aligned(64))) const unsigned char ${SYMBOL}[] = {\n${body}\n};\n"
  "const size_t ${SYMBOL}_len = ${nbytes};\n")
