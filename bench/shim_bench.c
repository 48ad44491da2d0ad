/* Syscall loops for bench/shim.sh.
 *
 *   shim_bench stat|open|read N PATH...
 *       N calls (paths round-robin); prints wall-clock and CPU (user + system) ns per call.
 *   shim_bench ab-stat|ab-open N PATH...
 *       Run under the shim: alternates blocks of calls through the hooked symbol and straight
 *       into libc's own function (looked up in libc.so.6), in the same process and time window,
 *       so machine noise hits both alike; prints ns per call for each and their ratio. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

typedef int (*stat_fn)(const char *, struct stat *);
typedef int (*open_fn)(const char *, int, ...);

static long failures;

static void ab(int is_stat, long n, char **paths, int np) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    stat_fn direct_stat = libc ? (stat_fn)dlsym(libc, "stat") : NULL;
    open_fn direct_open = libc ? (open_fn)dlsym(libc, "open") : NULL;
    if (!direct_stat || !direct_open || (void *)direct_stat == (void *)stat) {
        fprintf(stderr, "libc's own stat/open not found, or stat is not interposed\n");
        exit(2);
    }
    const long block = 1000;
    double hooked = 0, direct = 0;
    struct stat st;
    for (long done = 0; done < n; done += block) {
        for (int side = 0; side < 2; side++) {
            double t0 = now();
            for (long i = 0; i < block; i++) {
                const char *p = paths[(done + i) % np];
                if (is_stat) {
                    failures += (side ? direct_stat(p, &st) : stat(p, &st)) != 0;
                } else {
                    int fd = side ? direct_open(p, O_RDONLY) : open(p, O_RDONLY);
                    failures += fd < 0;
                    close(fd);
                }
            }
            *(side ? &direct : &hooked) += now() - t0;
        }
    }
    printf("%.1f %.1f\n", direct / n, hooked / n);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s stat|open|read|ab-stat|ab-open N PATH...\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long n = atol(argv[2]);
    char **paths = argv + 3;
    int np = argc - 3;
    if (strncmp(mode, "ab-", 3) == 0) {
        ab(mode[3] == 's', n, paths, np);
    } else {
        char buf[4096];
        struct stat st;
        double t0 = now();
        for (long i = 0; i < n; i++) {
            const char *p = paths[i % np];
            if (mode[0] == 's') {
                failures += stat(p, &st) != 0;
            } else {
                int fd = open(p, O_RDONLY);
                if (fd < 0) {
                    failures++;
                    continue;
                }
                if (mode[0] == 'r')
                    failures += read(fd, buf, sizeof buf) <= 0;
                close(fd);
            }
        }
        double wall = now() - t0;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double cpu = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e9 +
                     (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e3;
        printf("%.1f %.1f\n", wall / n, cpu / n);
    }
    if (failures) {
        fprintf(stderr, "%ld failed calls\n", failures);
        return 1;
    }
    return 0;
}
