/* Helper for shim/benches/streams.rs, compiled with `cc -O2` at bench time.
 *
 *   streams_tool server PORT
 *       plain listener on 127.0.0.1:PORT that accepts and closes at once (the server closes
 *       first, so TIME_WAIT lands on the server and client ports never pile up); never
 *       preloaded, the same for every variant.
 *   streams_tool connlat HOST PORT N WARMUP
 *       N timed rounds of socket() + connect() + close() (after WARMUP untimed ones); between
 *       connect and close it waits, untimed, for the server's FIN. Prints one line:
 *       `first_socket_ns=.. n=.. median_ns=.. p10_ns=.. p90_ns=.. mean_ns=..`.
 *   streams_tool sockpair SECONDS BLOCK
 *       AF_UNIX SOCK_STREAM socketpair, fork: the child writes BLOCK-byte blocks for SECONDS,
 *       the parent reads BLOCK-byte reads until EOF. Prints `bytes=.. seconds=.. bits_per_second=..
 *       cpu_percent=..` (CPU of both processes, percent of one core).
 *   streams_tool relay SECONDS BLOCK RELAYBUF
 *       what proxy mode over a TCP-backed provider does at best, without the shim: writer ->
 *       socketpair -> relay process -> TCP over lo -> relay process -> socketpair -> reader (4
 *       processes, blocking I/O, RELAYBUF-byte relay buffers). Prints like sockpair.
 *   streams_tool spawn N
 *       N times fork + exec of itself as `streams_tool firstsock` (one AF_INET stream socket,
 *       closed, exit), then N times as `streams_tool nosock` (exit at once); prints the median
 *       wall time of each: `sock_median_ns=.. nosock_median_ns=..`. A preload in the
 *       environment is inherited by the children.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* CPU time (user + system) of this process and its waited-for children, in percent of one
 * core over `elapsed` seconds: 200 means both cores of a 2-core machine were busy throughout. */
static double cpu_percent(double elapsed) {
    struct rusage self, kids;
    if (getrusage(RUSAGE_SELF, &self) != 0 || getrusage(RUSAGE_CHILDREN, &kids) != 0) return -1;
    double s = 0;
    s += (double)self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6;
    s += (double)self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6;
    s += (double)kids.ru_utime.tv_sec + kids.ru_utime.tv_usec / 1e6;
    s += (double)kids.ru_stime.tv_sec + kids.ru_stime.tv_usec / 1e6;
    return 100.0 * s / elapsed;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int server(int port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 4096) != 0) {
        perror("server");
        return 1;
    }
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("accept");
            return 1;
        }
        close(c);
    }
}

static int connlat(const char *host, int port, int n, int warmup) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "bad host %s\n", host);
        return 2;
    }
    double *samples = calloc((size_t)n, sizeof *samples);
    char buf[64];
    /* The process's first INET stream socket: a preloaded library decides here. */
    double t0 = now_ns();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    double first = now_ns() - t0;
    if (s < 0 || samples == NULL) {
        perror("socket");
        return 1;
    }
    close(s);
    for (int i = 0; i < warmup + n; i++) {
        t0 = now_ns();
        s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) {
            perror("socket");
            return 1;
        }
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
            fprintf(stderr, "connect (round %d): %s\n", i, strerror(errno));
            return 1;
        }
        double t1 = now_ns();
        while (read(s, buf, sizeof buf) > 0) {
        }
        double t2 = now_ns();
        close(s);
        double t3 = now_ns();
        if (i >= warmup) samples[i - warmup] = (t1 - t0) + (t3 - t2);
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += samples[i];
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    printf("first_socket_ns=%.0f n=%d median_ns=%.0f p10_ns=%.0f p90_ns=%.0f mean_ns=%.0f\n", first,
           n, samples[n / 2], samples[n / 10], samples[(n * 9) / 10], sum / n);
    return 0;
}

/* Writes BLOCK-byte blocks to fd for SECONDS, then closes it. */
static void writer(int fd, double seconds, size_t block) {
    char *buf = malloc(block);
    if (buf == NULL) _exit(1);
    memset(buf, 0x5a, block);
    double end = now_ns() + seconds * 1e9;
    while (now_ns() < end) {
        size_t off = 0;
        while (off < block) {
            ssize_t w = write(fd, buf + off, block - off);
            if (w < 0) {
                if (errno == EINTR) continue;
                _exit(1);
            }
            off += (size_t)w;
        }
    }
    close(fd);
}

/* Reads `fd` until EOF with BLOCK-byte reads; the bytes and seconds it took. -1 on error. */
static int drain(int fd, size_t block, unsigned long long *total, double *elapsed) {
    char *buf = malloc(block);
    if (buf == NULL) return -1;
    *total = 0;
    double start = now_ns();
    for (;;) {
        ssize_t r = read(fd, buf, block);
        if (r < 0) {
            if (errno == EINTR) continue;
            perror("read");
            free(buf);
            return -1;
        }
        if (r == 0) break;
        *total += (unsigned long long)r;
    }
    *elapsed = (now_ns() - start) / 1e9;
    free(buf);
    return 0;
}

/* The line sockpair and relay print, after every process they started was waited for. */
static void report(unsigned long long total, double elapsed) {
    printf("bytes=%llu seconds=%.6f bits_per_second=%.0f cpu_percent=%.0f\n", total, elapsed,
           total * 8.0 / elapsed, cpu_percent(elapsed));
}

static int sockpair(double seconds, size_t block) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        writer(sv[1], seconds, block);
        _exit(0);
    }
    close(sv[1]);
    unsigned long long total;
    double elapsed;
    if (drain(sv[0], block, &total, &elapsed) != 0) return 1;
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "writer failed\n");
        return 1;
    }
    report(total, elapsed);
    return 0;
}

/* Copies from `in` to `out` until EOF, then half-closes `out`. */
static void relay_copy(int in, int out, size_t bufsize) {
    char *buf = malloc(bufsize);
    if (buf == NULL) _exit(1);
    for (;;) {
        ssize_t r = read(in, buf, bufsize);
        if (r < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        if (r == 0) break;
        ssize_t off = 0;
        while (off < r) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0) {
                if (errno == EINTR) continue;
                _exit(1);
            }
            off += w;
        }
    }
    shutdown(out, SHUT_WR);
}

static int relay(double seconds, size_t block, size_t relaybuf) {
    int a[2], b[2];
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t salen = sizeof sa;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, a) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, b) != 0 ||
        ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &salen) != 0) {
        perror("relay setup");
        return 1;
    }
    pid_t pids[3];
    /* writer -> a[1] ... a[0] -> relay 1 -> TCP -> relay 2 -> b[1] ... b[0] -> reader */
    if ((pids[0] = fork()) == 0) {
        close(a[0]), close(b[0]), close(b[1]), close(ls);
        writer(a[1], seconds, block);
        _exit(0);
    }
    if ((pids[1] = fork()) == 0) {
        close(a[1]), close(b[0]), close(b[1]), close(ls);
        int t = socket(AF_INET, SOCK_STREAM, 0);
        if (t < 0 || connect(t, (struct sockaddr *)&sa, sizeof sa) != 0) _exit(1);
        relay_copy(a[0], t, relaybuf);
        char c;
        while (read(t, &c, 1) > 0) {
        }
        _exit(0);
    }
    if ((pids[2] = fork()) == 0) {
        close(a[0]), close(a[1]), close(b[0]);
        int t = accept(ls, NULL, NULL);
        if (t < 0) _exit(1);
        close(ls);
        relay_copy(t, b[1], relaybuf);
        close(t);
        _exit(0);
    }
    close(a[0]), close(a[1]), close(b[1]), close(ls);
    unsigned long long total;
    double elapsed;
    if (drain(b[0], block, &total, &elapsed) != 0) return 1;
    for (int i = 0; i < 3; i++) {
        int status = 0;
        if (pids[i] < 0 || waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "relay process %d failed\n", i);
            return 1;
        }
    }
    report(total, elapsed);
    return 0;
}

static double spawn_median(const char *self, const char *mode, int n) {
    double *t = calloc((size_t)n, sizeof *t);
    if (t == NULL) exit(1);
    for (int i = 0; i < n; i++) {
        double t0 = now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execl(self, self, mode, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%s child failed\n", mode);
            exit(1);
        }
        t[i] = now_ns() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = t[n / 2];
    free(t);
    return m;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "firstsock") == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) return 1;
        close(s);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "nosock") == 0) return 0;
    if (argc == 3 && strcmp(argv[1], "spawn") == 0) {
        int n = atoi(argv[2]);
        if (n <= 0) return 2;
        double sock = spawn_median("/proc/self/exe", "firstsock", n);
        double nosock = spawn_median("/proc/self/exe", "nosock", n);
        printf("sock_median_ns=%.0f nosock_median_ns=%.0f\n", sock, nosock);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "relay") == 0)
        return relay(atof(argv[2]), (size_t)atol(argv[3]), (size_t)atol(argv[4]));
    if (argc == 3 && strcmp(argv[1], "server") == 0) return server(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "connlat") == 0)
        return connlat(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 4 && strcmp(argv[1], "sockpair") == 0)
        return sockpair(atof(argv[2]), (size_t)atol(argv[3]));
    fprintf(stderr,
            "usage: %s server PORT | connlat HOST PORT N WARMUP | sockpair SECONDS BLOCK |"
            " relay SECONDS BLOCK RELAYBUF | spawn N\n",
            argv[0]);
    return 2;
}
