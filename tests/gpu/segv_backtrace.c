// A test-only LD_PRELOAD for the GPU machine, which has no gdb: on SIGSEGV, SIGBUS, SIGILL
// or SIGABRT it prints the native stack (symbols where the libraries export them, else
// library+offset) to stderr, then lets the signal kill the process as before. Used by
// bench/aoti_bench.py's diagnostics to find where a package load crashes inside torch.
//   gcc -shared -fPIC -O1 -o segv_backtrace.so tests/gpu/segv_backtrace.c
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char alt_stack[1 << 16];

static void on_fatal(int sig, siginfo_t* info, void* ctx) {
  (void)ctx;
  static const char head[] = "\n--- segv_backtrace: native stack ---\n";
  (void)!write(2, head, sizeof head - 1);
  char line[96];
  const char* name = strsignal(sig);
  size_t n = strlen(name);
  if (n > 60) n = 60;
  memcpy(line, name, n);
  line[n++] = '\n';
  (void)!write(2, line, n);
  (void)info;
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  stack_t ss;
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  ss.ss_flags = 0;
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) sigaction(sigs[i], &sa, NULL);
}
