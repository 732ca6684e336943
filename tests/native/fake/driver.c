/* A CUDA program as far as tuiprof's injection library can tell, for CPU tests: it does what
 * the CUDA driver does at cuInit (load CUDA_INJECTION64_PATH, call InitializeInjection), then
 * lets the stand-in libcupti emit a script of activity records, then ends as asked.
 *
 *   driver nocuda                    print, exit 3, no CUDA at all
 *   driver run SCRIPT PER_BUF STATUS emit, then exit(STATUS) from a function
 *   driver kill SCRIPT PER_BUF       emit, then SIGKILL itself (no exit flush)
 *   driver wait SCRIPT PER_BUF       emit, say "waiting", exit 5 at SIGINT
 *   driver deaf SCRIPT PER_BUF       emit, say "waiting", ignore SIGINT until killed
 *   driver spawn SCRIPT PER_BUF      emit, run "driver run SCRIPT PER_BUF 0" as a child, exit 0
 *   driver drip PREFIX N PER_BUF MS  emit PREFIX.0 .. PREFIX.N-1, one every MS ms (a live run)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t got_int;
static void on_int(int s) { (void)s; got_int = 1; }

static void leave(int status) { exit(status); }  /* exit() from a function, not main's return */

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "nocuda";
    printf("driver: %s\n", mode);
    fflush(stdout);
    if (!strcmp(mode, "nocuda")) return 3;
    const char *inj = getenv("CUDA_INJECTION64_PATH");
    if (inj) {
        void *h = dlopen(inj, RTLD_NOW);
        int (*init)(void) = h ? (int (*)(void))dlsym(h, "InitializeInjection") : NULL;
        if (!init) {
            fprintf(stderr, "driver: cannot load %s\n", inj);
            return 99;
        }
        init();
    }
    const char *cupti = getenv("TUIPROF_NATIVE_CUPTI");
    void *c = cupti ? dlopen(cupti, RTLD_NOW) : NULL;  /* the library's own handle */
    if (c && !strcmp(mode, "drip")) {
        int (*emit)(const char *, int) = (int (*)(const char *, int))dlsym(c, "fake_cupti_emit");
        int (*flush)(unsigned) = (int (*)(unsigned))dlsym(c, "cuptiActivityFlushAll");
        char path[4096];
        for (int i = 0; i < atoi(argv[3]); i++) {
            snprintf(path, sizeof path, "%s.%d", argv[2], i);
            emit(path, atoi(argv[4]));
            flush(0);  /* what CUPTI's flush period does */
            printf("driver: chunk %d\n", i);
            fflush(stdout);
            usleep(atoi(argv[5]) * 1000);
        }
        leave(0);
    }
    if (c) {
        void (*report)(void) = (void (*)(void))dlsym(c, "fake_cupti_report");
        int (*emit)(const char *, int) = (int (*)(const char *, int))dlsym(c, "fake_cupti_emit");
        report();
        int n = emit(argv[2], atoi(argv[3]));
        printf("driver: emitted %d\n", n);
        fflush(stdout);
    }
    if (!strcmp(mode, "kill")) {
        usleep(300000);  /* the sender sends what is queued; the held buffer is never flushed */
        raise(SIGKILL);
    }
    if (!strcmp(mode, "wait") || !strcmp(mode, "deaf")) {
        signal(SIGINT, strcmp(mode, "deaf") ? on_int : SIG_IGN);
        printf("driver: waiting\n");
        fflush(stdout);
        while (!got_int) pause();
        printf("driver: SIGINT\n");
        fflush(stdout);
        leave(5);
    }
    if (!strcmp(mode, "spawn")) {
        pid_t pid = fork();
        if (pid == 0) {
            execl(argv[0], argv[0], "run", argv[2], argv[3], "0", (char *)NULL);
            _exit(98);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        printf("driver: child status %d\n", WEXITSTATUS(st));
        leave(0);
    }
    leave(argc > 4 ? atoi(argv[4]) : 0);
    return 0;
}
