/*
 * libnvidia-ml.so.1 benchmark: CPU time (user + system, CLOCK_PROCESS_CPUTIME_ID) of nvmlInit
 * through the first device name (a fresh process each run: the tree is read at init), and of one
 * getter on a cached handle (nvmlDeviceGetMemoryInfo, averaged over N calls); and the resident
 * memory (VmRSS) the library adds: loaded, then with the tree read.
 * usage: nvml_bench N   (MOCKFS_ROOT names the tree; the library is found by its SONAME)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned long long total, free, used; } memory_t;

static double cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* VmRSS of this process, KiB */
static long rss_kib(void)
{
    char line[128];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    long rss0 = rss_kib();
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    long rss1 = rss_kib();
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    unsigned (*init)(void) = (unsigned (*)(void))dlsym(lib, "nvmlInit_v2");
    unsigned (*by_index)(unsigned, void **) = (unsigned (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    unsigned (*name)(void *, char *, unsigned) = (unsigned (*)(void *, char *, unsigned))dlsym(lib, "nvmlDeviceGetName");
    unsigned (*memory)(void *, memory_t *) = (unsigned (*)(void *, memory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    char buf[96];
    void *dev;
    double t0 = cpu_ns();
    if (init() || by_index(0, &dev) || name(dev, buf, sizeof buf)) {
        fprintf(stderr, "nvml_bench: init failed\n");
        return 1;
    }
    double t1 = cpu_ns();
    long rss2 = rss_kib();
    memory_t m;
    for (long i = 0; i < n; i++)
        if (memory(dev, &m))
            return 1;
    double t2 = cpu_ns();
    printf("%s: init to first name %.0f us CPU; nvmlDeviceGetMemoryInfo %.1f ns CPU per call; "
           "resident +%ld KiB loaded, +%ld KiB initialised\n",
           buf, (t1 - t0) / 1e3, (t2 - t1) / n, rss1 - rss0, rss2 - rss0);
    return 0;
}
