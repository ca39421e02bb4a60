# Build helpers shared by every layer.

function(glint_enable_ccache)
  find_program(GLINT_CCACHE ccache)
  if(GLINT_CCACHE)
    set(CMAKE_C_COMPILER_LAUNCHER ${GLINT_CCACHE} PARENT_SCOPE)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${GLINT_CCACHE} PARENT_SCOPE)
    message(STATUS "glint: compiling through ccache (${GLINT_CCACHE})")
  endif()
endfunction()

# Finds every library glint builds against. All come from Debian 12 packages
# installed by scripts/setup.sh; a missing one stops configuration with the
# package to install.
macro(glint_find_dependencies)
  find_package(Threads REQUIRED)
  find_package(PkgConfig REQUIRED)

  find_path(CAF_INCLUDE_DIR caf/all.hpp)
  find_library(CAF_CORE_LIBRARY caf_core)
  find_library(CAF_IO_LIBRARY caf_io)
  if(NOT CAF_INCLUDE_DIR OR NOT CAF_CORE_LIBRARY OR NOT CAF_IO_LIBRARY)
    message(FATAL_ERROR "CAF 0.17 not found: run scripts/setup.sh (Debian package libcaf-dev)")
  endif()
  add_library(glint_caf INTERFACE)
  target_include_directories(glint_caf SYSTEM INTERFACE ${CAF_INCLUDE_DIR})
  target_link_libraries(glint_caf INTERFACE ${CAF_IO_LIBRARY} ${CAF_CORE_LIBRARY} Threads::Threads)
  add_library(glint::caf ALIAS glint_caf)

  pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
  pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
  find_package(tomlplusplus REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(nlohmann_json REQUIRED)
  find_package(fmt REQUIRED)
endmacro()

# Each layer exposes an include root that holds only a link named after the
# layer, so `#include "runtime/tensor.hpp"` works from runtime and every layer
# above it, while a layer that includes one above it fails to compile: the
# header is simply not on its include path.
function(glint_layer_include_root layer out)
  set(root ${CMAKE_BINARY_DIR}/include/${layer})
  file(MAKE_DIRECTORY ${root})
  if(NOT EXISTS ${root}/${layer})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${layer} ${root}/${layer} SYMBOLIC)
  endif()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

function(glint_apply_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(GLINT_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${GLINT_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${GLINT_SANITIZE})
  endif()
endfunction()

# glint_add_layer(NAME SOURCES a.cpp ... DEPS glint::x ... [PCH <h> ...])
# Creates the static library glint_NAME (alias glint::NAME).
function(glint_add_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS;PRIVATE_DEPS;PCH" ${ARGN})
  add_library(glint_${name} STATIC ${L_SOURCES})
  add_library(glint::${name} ALIAS glint_${name})
  glint_layer_include_root(${name} root)
  target_include_directories(glint_${name} PUBLIC $<BUILD_INTERFACE:${root}>)
  target_link_libraries(glint_${name} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  glint_apply_warnings(glint_${name})
  if(L_PCH)
    target_precompile_headers(glint_${name} PRIVATE ${L_PCH})
  endif()
  if(GLINT_SANITIZE)
    target_link_options(glint_${name} INTERFACE -fsanitize=${GLINT_SANITIZE})
  endif()
endfunction()
