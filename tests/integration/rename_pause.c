// LD_PRELOAD fault injection for tests/integration/checkpoint_kill_test.cc: blocks the
// server at one rename(2) of a checkpoint write, so that the test's SIGKILL lands in a
// window that polling from outside cannot hit (SaveCheckpoint with overwrite moves the
// old checkpoint aside and renames the new one in microseconds apart). The server has no
// hook of its own; with this library preloaded its rename calls come here first.
//
//   LD_PRELOAD=.../rename_pause.so TESERVE_TEST_RENAME_PAUSE=<before|after>:<name>[*]
//
// The first rename whose destination's last path component is <name> (starts with it,
// with the trailing '*') writes "rename_pause: paused <before|after> renaming <from> to
// <to>" to stderr and blocks the calling thread for good (the test kills the process):
// "before" when the rename has not happened, "after" when it has succeeded. With
// TESERVE_TEST_RENAME_PAUSE_MS=<n> it blocks n milliseconds instead and goes on. Every
// other rename runs as it would without the library.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*RenameFn)(const char*, const char*);

static int fired = 0;

// Whether `to`'s last path component matches `pattern` (exactly, or by prefix when the
// pattern ends with '*').
static int Matches(const char* to, const char* pattern) {
  const char* slash = strrchr(to, '/');
  const char* base = slash != NULL ? slash + 1 : to;
  const size_t n = strlen(pattern);
  if (n > 0 && pattern[n - 1] == '*') return strncmp(base, pattern, n - 1) == 0;
  return strcmp(base, pattern) == 0;
}

static void PauseForGood(const char* when, const char* from, const char* to) {
  char line[8192];
  const int n = snprintf(line, sizeof(line), "rename_pause: paused %s renaming %s to %s\n", when, from, to);
  if (n > 0) {
    ssize_t ignored = write(2, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1);
    (void)ignored;
  }
  const char* ms = getenv("TESERVE_TEST_RENAME_PAUSE_MS");
  const long n_ms = ms != NULL ? strtol(ms, NULL, 10) : 0;
  if (n_ms <= 0) {
    for (;;) pause();
  }
  struct timespec left = {n_ms / 1000, (n_ms % 1000) * 1000000L};
  while (nanosleep(&left, &left) != 0) {
  }
}

int rename(const char* from, const char* to) {
  static RenameFn real = NULL;
  if (real == NULL) real = (RenameFn)dlsym(RTLD_NEXT, "rename");
  const char* spec = getenv("TESERVE_TEST_RENAME_PAUSE");
  int before = 0, after = 0;
  if (spec != NULL && to != NULL) {
    if (strncmp(spec, "before:", 7) == 0) before = Matches(to, spec + 7);
    if (strncmp(spec, "after:", 6) == 0) after = Matches(to, spec + 6);
  }
  if (before && !__atomic_exchange_n(&fired, 1, __ATOMIC_SEQ_CST)) PauseForGood("before", from, to);
  const int rc = real(from, to);
  if (rc == 0 && after && !__atomic_exchange_n(&fired, 1, __ATOMIC_SEQ_CST)) PauseForGood("after", from, to);
  return rc;
}
