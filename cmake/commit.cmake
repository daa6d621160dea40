# Writes OUT, a header defining EF_COMMIT: the commit of the source tree SRC (12 hex digits, with
# "-modified" when tracked files differ from it), or what SRC/COMMIT says in a source tree without
# git (a release tarball), or "unknown". Run at every build (apps/CMakeLists.txt), it rewrites OUT
# only when the text changes, so an unchanged commit recompiles nothing.
# cmake -DSRC=<source dir> -DOUT=<header> -P cmake/commit.cmake
set(commit unknown)
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS ${SRC}/.git)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --short=12 HEAD OUTPUT_VARIABLE head
                  RESULT_VARIABLE failed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT failed)
    set(commit ${head})
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(changes)
      string(APPEND commit "-modified")
    endif()
  endif()
elseif(EXISTS ${SRC}/COMMIT)
  file(STRINGS ${SRC}/COMMIT commit LIMIT_COUNT 1)
endif()
set(text "#define EF_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
