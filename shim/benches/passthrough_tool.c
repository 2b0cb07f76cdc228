/* Helper for shim/benches/passthrough.rs, compiled with `cc -O2` at bench time.
 *
 *   passthrough_tool server PORT
 *       plain listener on 127.0.0.1:PORT that accepts and closes at once (the server closes
 *       first, so TIME_WAIT lands on the server and client ports never pile up); never
 *       preloaded, the same for every variant.
 *   passthrough_tool connlat HOST PORT N WARMUP
 *       N timed rounds of socket() + connect() + close() (after WARMUP untimed ones); between
 *       connect and close it waits, untimed, for the server's FIN. Prints one line:
 *       `first_socket_ns=.. n=.. median_ns=.. p10_ns=.. p90_ns=.. p99_ns=.. mean_ns=..`.
 *   passthrough_tool spawn N
 *       N times fork + exec of itself as `passthrough_tool firstsock` (one AF_INET stream
 *       socket, closed, exit), then N times as `passthrough_tool nosock` (exit at once); prints
 *       the median wall time of each: `sock_median_ns=.. nosock_median_ns=..`. A preload in the
 *       environment is inherited by the children.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
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
    printf("first_socket_ns=%.0f n=%d median_ns=%.0f p10_ns=%.0f p90_ns=%.0f p99_ns=%.0f mean_ns=%.0f\n",
           first, n, samples[n / 2], samples[n / 10], samples[(n * 9) / 10], samples[(n * 99) / 100],
           sum / n);
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
    if (argc == 3 && strcmp(argv[1], "server") == 0) return server(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "connlat") == 0)
        return connlat(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    fprintf(stderr,
            "usage: %s server PORT | connlat HOST PORT N WARMUP | spawn N\n",
            argv[0]);
    return 2;
}
