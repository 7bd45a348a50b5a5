// The version of libdeltacast a program runs with (deltacast/c/worker.h).
#include "deltacast/c/worker.h"

#ifndef DELTACAST_VERSION_STRING
#error "DELTACAST_VERSION_STRING is set by CMake"
#endif

extern "C" const char* dc_library_version(void) { return DELTACAST_VERSION_STRING; }
