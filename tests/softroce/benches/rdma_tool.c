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

static int server(const char *addr, int port) {
    struct sockaddr_in sa;
    int one = 1;
    if (addr_of(addr, port, &sa) != 0) return 2;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 4096) != 0) {
        perror("server");
        return 1;
    }
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

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "run") == 0) return run(argv[2], argv + 3);
    if (argc == 4 && strcmp(argv[1], "server") == 0) return server(argv[2], atoi(argv[3]));
    if (argc == 6 && strcmp(argv[1], "connlat") == 0)
        return connlat(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    fprintf(stderr,
            "usage: %s run OUTFILE CMD ARGS... | server ADDR PORT | connlat HOST PORT N WARMUP\n",
            argv[0]);
    return 2;
}
