/* bench_proc.h -- what the benchmarks that start real daemons share:
 * spawning one with its stderr in a log, and waiting until a broker
 * reports its workers. */
#ifndef REEL_BENCH_BENCH_PROC_H
#define REEL_BENCH_BENCH_PROC_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "clients/c/client.h"

/* argv[0] (a path) with stdout to /dev/null and stderr to log; its pid. */
static inline pid_t bench_spawn(char *const argv[], const char *log) {
    fflush(stdout); /* the child must not print this process's buffered lines again */
    pid_t p = fork();
    if (p == 0) {
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

/* Until the broker c talks to lists n workers: up to 5 minutes (a
 * 1.3b worker loads 5.7 GB first). Exits the process if they never come,
 * or at once, with the last line of its log, when one of the np processes
 * pids (whose stderr went to logs[i]) has exited (a worker that cannot
 * start: --no-fallback without a GPU); the others are killed first. */
static inline void bench_wait_workers_of(reel_client_t *c, int n, const char *who, const pid_t *pids,
                                         const char *const *logs, int np) {
    for (int i = 0; i < 3000; i++) {
        reel_status_t *s = NULL;
        wire_err_t err;
        if (reel_status(c, &s, 2000, &err) == 0) {
            size_t have = reel_status_reply(s)->n_workers;
            reel_status_free(&s);
            if ((int)have >= n) return;
        }
        for (int k = 0; k < np; k++) {
            int st;
            if (waitpid(pids[k], &st, WNOHANG) != pids[k]) continue;
            char line[512] = "", last[512] = "(no output)";
            FILE *f = fopen(logs[k], "r");
            while (f && fgets(line, sizeof line, f))
                if (line[0] != '\n') snprintf(last, sizeof last, "%s", line);
            if (f) fclose(f);
            fprintf(stderr, "%s: %s exited before it registered: %s", who, logs[k], last);
            for (int o = 0; o < np; o++)
                if (o != k && kill(pids[o], SIGKILL) == 0) waitpid(pids[o], NULL, 0);
            exit(1);
        }
        usleep(100000);
    }
    fprintf(stderr, "%s: the workers did not register\n", who);
    exit(1);
}

static inline void bench_wait_workers(reel_client_t *c, int n, const char *who) {
    bench_wait_workers_of(c, n, who, NULL, NULL, 0);
}

#endif
