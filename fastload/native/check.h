// FL_CHECK: TORCH_CHECK with a printf-formatted message.
//
// Why not TORCH_CHECK(cond, "text ", number): c10::str formats numbers through a std::ostream instantiated in
// this extension, and on some toolchain mixes (seen with torch 2.11 on Ubuntu 24.04, gcc 13) that numeric
// insert crashes inside the extension, turning a clear error into a segfault. snprintf has no such coupling;
// TORCH_CHECK with one const char* message passes it through untouched.
#pragma once
#include <c10/util/Exception.h>

#include <cstdarg>
#include <cstdio>

namespace fastload {

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void check_fail(const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  TORCH_CHECK(false, static_cast<const char*>(message));
}

}  // namespace fastload

#define FL_CHECK(cond, ...)                                      \
  do {                                                           \
    if (!(cond)) ::fastload::check_fail(__VA_ARGS__);            \
  } while (0)
