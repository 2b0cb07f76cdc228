/* The least a userspace TCP relay can cost, for gateway/testbed/benches/chain.rs (`cc -O2` at bench
 * time): listens on LISTEN_IP:PORT, and for every connection dials DST_IP:DST_PORT and copies
 * both directions with blocking read/write and 256 KiB buffers (the gateway's pump buffer), one
 * process per direction; EOF half-closes the other side. No select/poll loop, no framing: the
 * same hops as the gateway path at the lowest cost a relay has.
 *
 *   tcprelay LISTEN_IP PORT DST_IP DST_PORT     prints "ready" once listening
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF (256 * 1024)

static void copy(int in, int out) {
    char *buf = malloc(BUF);
    if (buf == NULL) _exit(1);
    for (;;) {
        ssize_t r = read(in, buf, BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) _exit(0);
            off += w;
        }
    }
    shutdown(out, SHUT_WR);
    _exit(0);
}

static int addr(struct sockaddr_in *sa, const char *ip, const char *port) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((unsigned short)atoi(port));
    return inet_pton(AF_INET, ip, &sa->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    struct sockaddr_in la, da;
    if (argc != 5 || addr(&la, argv[1], argv[2]) != 0 || addr(&da, argv[3], argv[4]) != 0) {
        fprintf(stderr, "usage: %s LISTEN_IP PORT DST_IP DST_PORT\n", argv[0]);
        return 2;
    }
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    int one = 1;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&la, sizeof la) != 0 || listen(ls, 64) != 0) {
        perror("listen");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR) continue;
            perror("accept");
            return 1;
        }
        if (fork() == 0) {
            close(ls);
            int d = socket(AF_INET, SOCK_STREAM, 0);
            if (d < 0 || connect(d, (struct sockaddr *)&da, sizeof da) != 0) _exit(1);
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(d, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (fork() == 0) copy(c, d);
            copy(d, c);
        }
        close(c);
    }
}
