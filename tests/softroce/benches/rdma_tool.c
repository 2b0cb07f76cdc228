/* Helper of tests/softroce/benches/rdma.rs, compiled with `cc -O2` on the host at bench time
 * and run inside the Soft-RoCE guest (whose root is the host's).
 *
 *   rdma_tool run OUTFILE CMD ARGS...
 *       runs CMD (execvp) as a child and waits for it; writes one line to OUTFILE:
 *       `start_ns=.. end_ns=.. utime_us=.. stime_us=.. status=..` (CLOCK_MONOTONIC around
 *       fork and wait4; the child's user and system CPU, all its threads and the children it
 *       waited for; status: the exit code, or 128 + the signal). Exits with that status.
 *       SIGTERM, SIGINT and SIGHUP are passed on to CMD.
 *   rdma_tool server ADDR PORT
 *       listens on ADDR:PORT, accepts connections and, for each, echoes every byte it reads
 *       until it echoed an `x`, then closes it (the server closes first, so TIME_WAIT lands on
 *       the server and client ports never pile up); SIGTERM ends it with exit(0), so that a
 *       preloaded library's exit handlers run (the shim writes its STREAMSHIM_STATS file there).
 *   rdma_tool connlat HOST PORT N WARMUP
 *       N timed rounds to HOST:PORT (after WARMUP untimed ones) of socket() + connect(), one
 *       byte written and its echo read, KEEP more 1-byte round trips on the open connection,
 *       a last `x` echoed, the server's FIN awaited, close(). Prints one line:
 *       `n=.. median_ns=.. p90_ns=.. p99_ns=.. max_ns=.. mean_ns=.. first_socket_ns=..
 *       echo_median_ns=.. echo_p99_ns=.. rtt_median_ns=.. rtt_p99_ns=..`: median_ns and the
 *       rest time socket() + connect() + close() (the echoes and the wait for the FIN untimed),
 *       echo_* socket() until the first echoed byte is back (what an app's first request
 *       costs), rtt_* each of the KEEP round trips (a request and its reply on a kept-alive
 *       connection). Then one more connection carries LONG round trips (after 50 untimed):
 *       long_rtt_median_ns=.. long_rtt_p99_ns=.. (a connection that lives: a database session).
 *       With CONNLAT_PAUSE_US set, each round ends with a pause of that many microseconds
 *       (a client that does something between its connections).
 *   rdma_tool httpget HOST PORT PATH N WARMUP
 *       N timed HTTP/1.0 GETs of PATH (after WARMUP untimed ones), one after the other, each on
 *       a new connection (socket, connect, the request, the whole response read until the
 *       server's close, close): requests without keep-alive. Fails unless every response is
 *       `200`. Prints `n=.. total_ns=.. median_ns=.. p99_ns=.. bytes=..` (total: the N
 *       requests' wall time; bytes: one response's).
 *   rdma_tool sink ADDR PORT
 *       accepts connections one at a time; reads each until EOF, then writes its byte count
 *       as one line and closes. SIGTERM ends it with exit(0).
 *   rdma_tool first HOST PORT BYTES
 *       a fresh connection's first BYTES: socket() + connect() + BYTES written (1 MiB writes)
 *       + shutdown(SHUT_WR), until the sink's count is back. Fails unless the count is BYTES.
 *       Prints `bytes=.. total_ns=.. connect_ns=..`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static long long tv_us(struct timeval tv) { return (long long)tv.tv_sec * 1000000LL + tv.tv_usec; }

static volatile pid_t child_pid;
static volatile sig_atomic_t stop;

static void forward(int sig) {
    if (child_pid > 0) kill(child_pid, sig);
}

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

/* Installs `fn` for SIGTERM, SIGINT and SIGHUP, without SA_RESTART (a blocked accept or wait
 * returns EINTR). */
static void handle_stop_signals(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static int run(const char *outfile, char **argv) {
    long long start = now_ns();
    handle_stop_signals(forward);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 125;
    }
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("wait4");
            return 125;
        }
    }
    long long end = now_ns();
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = fopen(outfile, "w");
    if (f == NULL) {
        perror(outfile);
        return 125;
    }
    fprintf(f, "start_ns=%lld end_ns=%lld utime_us=%lld stime_us=%lld status=%d\n", start, end,
            tv_us(ru.ru_utime), tv_us(ru.ru_stime), code);
    fclose(f);
    return code;
}

static int addr_of(const char *host, int port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", host);
        return -1;
    }
    return 0;
}

/* A listening socket on ADDR:PORT with SO_REUSEADDR; -2 for a bad address, -1 after a
 * message naming `what`. */
static int listen_on(const char *addr, int port, int backlog, const char *what) {
    struct sockaddr_in sa;
    int one = 1;
    if (addr_of(addr, port, &sa) != 0) return -2;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, backlog) != 0) {
        perror(what);
        return -1;
    }
    return ls;
}

static int server(const char *addr, int port) {
    int ls = listen_on(addr, port, 4096, "server");
    if (ls < 0) return ls == -2 ? 2 : 1;
    handle_stop_signals(on_stop);
    while (!stop) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("accept");
            return 1;
        }
        char b;
        while (read(c, &b, 1) == 1) {
            if (write(c, &b, 1) != 1) {
                perror("echo");
                break;
            }
            if (b == 'x') break;
        }
        close(c);
    }
    close(ls);
    exit(0);
}

/* Round trips on each connection after its first echo, and on the last, long one. */
#define KEEP 10
#define LONG 1000

/* One byte out and its echo back; 0, or -1 with errno. */
static int round_trip(int s, char byte) {
    char b;
    if (write(s, &byte, 1) != 1) return -1;
    if (read(s, &b, 1) != 1 || b != byte) {
        if (errno == 0) errno = EPROTO;
        return -1;
    }
    return 0;
}

static int connlat(const char *host, int port, int n, int warmup) {
    struct sockaddr_in sa;
    if (addr_of(host, port, &sa) != 0 || n <= 0) return 2;
    long long *samples = calloc((size_t)n, sizeof *samples);
    long long *echoes = calloc((size_t)n, sizeof *echoes);
    long long *rtts = calloc((size_t)n * KEEP, sizeof *rtts);
    char buf[64];
    const char *pause_env = getenv("CONNLAT_PAUSE_US");
    long pause_us = pause_env != NULL ? atol(pause_env) : 0;
    /* The process's first INET stream socket: a preloaded library decides here. */
    long long t0 = now_ns();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    long long first = now_ns() - t0;
    if (s < 0 || samples == NULL || echoes == NULL || rtts == NULL) {
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
        long long t1 = now_ns();
        if (round_trip(s, 'k') != 0) {
            fprintf(stderr, "no echo (round %d): %s\n", i, strerror(errno));
            return 1;
        }
        long long te = now_ns();
        for (int k = 0; k < KEEP; k++) {
            long long tk = now_ns();
            if (round_trip(s, 'k') != 0) {
                fprintf(stderr, "no echo (round %d, trip %d): %s\n", i, k, strerror(errno));
                return 1;
            }
            if (i >= warmup) rtts[(i - warmup) * KEEP + k] = now_ns() - tk;
        }
        if (round_trip(s, 'x') != 0) {
            fprintf(stderr, "no last echo (round %d): %s\n", i, strerror(errno));
            return 1;
        }
        while (read(s, buf, sizeof buf) > 0) {
        }
        long long t2 = now_ns();
        close(s);
        long long t3 = now_ns();
        if (pause_us > 0) usleep((useconds_t)pause_us);
        if (i >= warmup) {
            samples[i - warmup] = (t1 - t0) + (t3 - t2);
            echoes[i - warmup] = te - t0;
        }
    }
    long long sum = 0;
    for (int i = 0; i < n; i++) sum += samples[i];
    qsort(samples, (size_t)n, sizeof *samples, cmp_ll);
    qsort(echoes, (size_t)n, sizeof *echoes, cmp_ll);
    int m = n * KEEP;
    qsort(rtts, (size_t)m, sizeof *rtts, cmp_ll);
    /* One long-lived connection. */
    long long *longs = calloc(LONG, sizeof *longs);
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (longs == NULL || s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("long connection");
        return 1;
    }
    for (int k = -50; k < LONG; k++) {
        long long tk = now_ns();
        if (round_trip(s, 'k') != 0) {
            fprintf(stderr, "no echo (long connection, trip %d): %s\n", k, strerror(errno));
            return 1;
        }
        if (k >= 0) longs[k] = now_ns() - tk;
    }
    if (round_trip(s, 'x') != 0) {
        fprintf(stderr, "no last echo (long connection): %s\n", strerror(errno));
        return 1;
    }
    while (read(s, buf, sizeof buf) > 0) {
    }
    close(s);
    qsort(longs, LONG, sizeof *longs, cmp_ll);
    printf("n=%d median_ns=%lld p90_ns=%lld p99_ns=%lld max_ns=%lld mean_ns=%lld first_socket_ns=%lld "
           "echo_median_ns=%lld echo_p99_ns=%lld rtt_median_ns=%lld rtt_p99_ns=%lld long_rtt_median_ns=%lld "
           "long_rtt_p99_ns=%lld\n",
           n, samples[n / 2], samples[(n * 9) / 10], samples[(n * 99) / 100], samples[n - 1], sum / n,
           first, echoes[n / 2], echoes[(n * 99) / 100], rtts[m / 2], rtts[(m * 99) / 100], longs[LONG / 2],
           longs[(LONG * 99) / 100]);
    return 0;
}

/* Connects a new socket to `sa`; the fd, or -1 after a message. */
static int dial(const struct sockaddr_in *sa) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
        perror("socket");
        return -1;
    }
    if (connect(s, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        perror("connect");
        close(s);
        return -1;
    }
    return s;
}

/* Writes all of `buf`; 0, or -1. */
static int write_all(int s, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t w = write(s, buf, len);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            return -1;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

static int httpget(const char *host, int port, const char *path, int n, int warmup) {
    struct sockaddr_in sa;
    if (addr_of(host, port, &sa) != 0 || n <= 0) return 2;
    long long *samples = calloc((size_t)n, sizeof *samples);
    char req[512];
    static char buf[65536];
    int len = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host);
    if (samples == NULL || len <= 0 || (size_t)len >= sizeof req) return 2;
    long long total = 0, bytes = 0;
    for (int i = 0; i < warmup + n; i++) {
        long long t0 = now_ns();
        int s = dial(&sa);
        if (s < 0) {
            fprintf(stderr, "request %d: no connection\n", i);
            return 1;
        }
        if (write_all(s, req, (size_t)len) != 0) {
            fprintf(stderr, "request %d: write: %s\n", i, strerror(errno));
            return 1;
        }
        long long got = 0;
        char head[16] = {0};
        ssize_t r;
        while ((r = read(s, buf, sizeof buf)) > 0) {
            if (got < (long long)sizeof head - 1) {
                size_t k = sizeof head - 1 - (size_t)got;
                memcpy(head + got, buf, (size_t)r < k ? (size_t)r : k);
            }
            got += r;
        }
        close(s);
        long long dt = now_ns() - t0;
        if (r < 0 || strncmp(head + 9, "200", 3) != 0) {
            fprintf(stderr, "request %d: %s (%lld bytes: %.15s)\n", i, r < 0 ? strerror(errno) : "not 200", got,
                    head);
            return 1;
        }
        if (i >= warmup) {
            samples[i - warmup] = dt;
            total += dt;
            bytes = got;
        }
    }
    qsort(samples, (size_t)n, sizeof *samples, cmp_ll);
    printf("n=%d total_ns=%lld median_ns=%lld p99_ns=%lld bytes=%lld\n", n, total, samples[n / 2],
           samples[(n * 99) / 100], bytes);
    return 0;
}

static int sink(const char *addr, int port) {
    int ls = listen_on(addr, port, 64, "sink");
    if (ls < 0) return ls == -2 ? 2 : 1;
    static char buf[1 << 20];
    handle_stop_signals(on_stop);
    while (!stop) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("accept");
            return 1;
        }
        long long got = 0;
        ssize_t r;
        while ((r = read(c, buf, sizeof buf)) > 0) got += r;
        char line[32];
        int k = snprintf(line, sizeof line, "%lld\n", got);
        if (r < 0 || write_all(c, line, (size_t)k) != 0) perror("sink: connection");
        close(c);
    }
    close(ls);
    exit(0);
}

static int first(const char *host, int port, long long bytes) {
    struct sockaddr_in sa;
    if (addr_of(host, port, &sa) != 0 || bytes <= 0) return 2;
    static char buf[1 << 20];
    memset(buf, 'f', sizeof buf);
    long long t0 = now_ns();
    int s = dial(&sa);
    if (s < 0) return 1;
    long long t1 = now_ns();
    for (long long left = bytes; left > 0;) {
        size_t k = left < (long long)sizeof buf ? (size_t)left : sizeof buf;
        if (write_all(s, buf, k) != 0) {
            perror("first: write");
            return 1;
        }
        left -= (long long)k;
    }
    shutdown(s, SHUT_WR);
    char line[32] = {0};
    ssize_t got = 0, r;
    while (got < (ssize_t)sizeof line - 1 && (r = read(s, line + got, sizeof line - 1 - (size_t)got)) > 0) got += r;
    long long t2 = now_ns();
    close(s);
    if (atoll(line) != bytes) {
        fprintf(stderr, "first: the sink counted %s, not %lld\n", line, bytes);
        return 1;
    }
    printf("bytes=%lld total_ns=%lld connect_ns=%lld\n", bytes, t2 - t0, t1 - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "run") == 0) return run(argv[2], argv + 3);
    if (argc == 4 && strcmp(argv[1], "server") == 0) return server(argv[2], atoi(argv[3]));
    if (argc == 6 && strcmp(argv[1], "connlat") == 0)
        return connlat(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 7 && strcmp(argv[1], "httpget") == 0)
        return httpget(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]), atoi(argv[6]));
    if (argc == 4 && strcmp(argv[1], "sink") == 0) return sink(argv[2], atoi(argv[3]));
    if (argc == 5 && strcmp(argv[1], "first") == 0) return first(argv[2], atoi(argv[3]), atoll(argv[4]));
    fprintf(stderr,
            "usage: %s run OUTFILE CMD ARGS... | server ADDR PORT | connlat HOST PORT N WARMUP | "
            "httpget HOST PORT PATH N WARMUP | sink ADDR PORT | first HOST PORT BYTES\n",
            argv[0]);
    return 2;
}
