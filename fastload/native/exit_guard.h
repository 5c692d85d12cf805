// Native work on threads other than the interpreter's main one, at interpreter exit (bindings.cpp defines these).
#pragma once

namespace fastload {

// On a thread other than the interpreter's main one, once the interpreter's finalisation has begun: sleeps until
// the process is gone instead of returning. A thread that returns then takes the GIL back, and CPython (3.13 and
// older) ends it with pthread_exit, whose unwinding through the C++ frames above (torch's dispatcher, pybind11)
// aborts the process: std::terminate, exit 134. CPython 3.14 itself parks such threads the same way. Elsewhere
// it returns at once. (Beyond reach here: a thread that returned just before the finalisation began and still
// waits for the GIL, which only the main thread's last stretch of C code before the finalisation can make it do.)
void stay_if_exiting();

// stay_if_exiting() at the end of a scope, however it ends: each CPU op's entry point holds one, since torch's
// dispatcher releases the GIL around the op and takes it back after.
struct StayIfExiting {
  StayIfExiting() = default;
  StayIfExiting(const StayIfExiting&) = delete;
  StayIfExiting& operator=(const StayIfExiting&) = delete;
  ~StayIfExiting() { stay_if_exiting(); }
};

}  // namespace fastload
