// A crash's stack, for the GPU check (scripts/gpu_check.sh preloads it into the tests and the
// programs they run): on SIGSEGV, SIGBUS or SIGABRT, each frame's module and offset go to stderr as
// "crash frame <module> <offset>", which the check turns into function names with addr2line after
// the stage -- a window of device time is too short to run a crash again under a debugger. Then the
// signal's default action, so the exit status is the crash's.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static void print_stack(int sig, siginfo_t* info, void* context) {
  (void)context;
  void* frames[64];
  const int n = backtrace(frames, 64);
  fprintf(stderr, "crash: signal %d (%s) at address %p\n", sig, strsignal(sig), info->si_addr);
  for (int i = 0; i < n; ++i) {
    Dl_info where;
    // Frames 0 and 1 are this handler and the signal trampoline, 2 the faulting instruction; the
    // others are return addresses, which point after their call: one byte back is inside it.
    const char* pc = (const char*)frames[i] - (i > 2 ? 1 : 0);
    if (dladdr(pc, &where) && where.dli_fname)
      fprintf(stderr, "crash frame %s 0x%lx\n", where.dli_fname, (unsigned long)(pc - (const char*)where.dli_fbase));
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = print_stack;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, NULL);
  sigaction(SIGBUS, &action, NULL);
  sigaction(SIGABRT, &action, NULL);
}
