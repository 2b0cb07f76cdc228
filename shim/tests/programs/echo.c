/* An unmodified C program for the shim tests, built with -D_FORTIFY_SOURCE=2 -O2 (so read()
 * becomes __read_chk): an echo server that forks per connection, and a client that sends a
 * file through the echo and writes what comes back, moving the connected fd around the way
 * real programs do.
 *
 *   echo server PORT COUNT          accept COUNT connections, fork a child per connection that
 *                                   echoes until EOF, then half-closes; exit 0 when all
 *                                   children exited 0
 *   echo client HOST PORT IN OUT MODE
 *        MODE plain  non-blocking connect (poll + SO_ERROR), then the echo on the fd
 *             dup    dup, fcntl(F_DUPFD_CLOEXEC), dup2, dup3; the original closed; writes on
 *                    one copy, reads on another; getpeername on the copies
 *             peek   every read is preceded by recv(MSG_PEEK) and recvmsg(MSG_PEEK) of the
 *                    same bytes
 *             scm    the fd goes to a forked child over SCM_RIGHTS; the child echoes
 *             exec   the fd (no CLOEXEC) is inherited by an exec'd copy of this program,
 *                    which echoes ("echo run FD IN OUT")
 *             epoll  the socket is registered with epoll before connect() and the echo is
 *                    driven by epoll_wait (level-triggered, the registration modified)
 *             epollet  as nginx registers its upstreams: EPOLLIN | EPOLLOUT | EPOLLRDHUP |
 *                    EPOLLET before connect(), never modified; the echo reads and writes
 *                    until EAGAIN on each event
 *             blast  writes IN (OUT unused) and calls exit(0) at once: no close, no shutdown
 *   echo sink PORT OUT              accept one connection, write what it carries to OUT
 * Exit status 0 only if every byte came back in order and every check held; one line on
 * stderr says what failed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *self_path;

static void die(const char *what) {
    fprintf(stderr, "echo: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void fail(const char *what) {
    fprintf(stderr, "echo: %s\n", what);
    exit(3);
}

static void set_nonblocking(int fd, int on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) die("fcntl(F_GETFL)");
    if (fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) < 0) die("fcntl(F_SETFL)");
}

/* The peer of fd must be an IPv4 address with this port (an upgraded fd answers from the
 * kept TCP socket, not with the AF_UNIX address of its socketpair end). */
static void check_peer(int fd, int port) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0) die("getpeername");
    if (ss.ss_family != AF_INET) fail("getpeername: not AF_INET");
    if (ntohs(((struct sockaddr_in *)&ss)->sin_port) != port) fail("getpeername: wrong port");
    int nodelay = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay) < 0) die("TCP_NODELAY");
}

/* Sends `in` through fd and writes what comes back to `out`, with poll: both directions at
 * once, half-close after the last byte, until EOF. `rfd`/`wfd` may be two copies of one fd.
 * In peek mode every read is checked against MSG_PEEK through recv and recvmsg first. */
static void run_echo(int rfd, int wfd, const char *in, const char *out, int peek) {
    int ifd = open(in, O_RDONLY);
    if (ifd < 0) die("open IN");
    int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (ofd < 0) die("open OUT");
    set_nonblocking(rfd, 1);
    set_nonblocking(wfd, 1);
    char wbuf[65536];
    char rbuf[65536];
    char pbuf[65536];
    size_t wlen = 0, woff = 0;
    int in_eof = 0, out_eof = 0, shut = 0;
    long long sent = 0, got = 0;
    while (!out_eof) {
        if (!in_eof && woff == wlen) {
            ssize_t n = read(ifd, wbuf, sizeof wbuf);
            if (n < 0) die("read IN");
            if (n == 0) in_eof = 1;
            wlen = (size_t)n;
            woff = 0;
        }
        if (in_eof && woff == wlen && !shut) {
            if (shutdown(wfd, SHUT_WR) < 0) die("shutdown");
            shut = 1;
        }
        struct pollfd p[2];
        int np = 0;
        p[np].fd = rfd;
        p[np].events = POLLIN;
        np++;
        if (woff < wlen) {
            p[np].fd = wfd;
            p[np].events = POLLOUT;
            np++;
        }
        if (poll(p, np, 20000) <= 0) fail("poll: nothing for 20 s");
        if (woff < wlen) {
            ssize_t n = write(wfd, wbuf + woff, wlen - woff);
            if (n < 0 && errno != EAGAIN) die("write");
            if (n > 0) {
                woff += (size_t)n;
                sent += n;
            }
        }
        size_t want = sizeof rbuf;
        /* Bytes may arrive between an empty peek and the read: only a peek that returned
         * bytes is compared with what the read returns. */
        int peeked = 0;
        if (peek) {
            ssize_t pn = recv(rfd, pbuf, want, MSG_PEEK);
            if (pn < 0 && errno != EAGAIN) die("recv(MSG_PEEK)");
            if (pn > 0) {
                char mbuf[65536];
                struct iovec iov = {mbuf, (size_t)pn};
                struct msghdr mh;
                memset(&mh, 0, sizeof mh);
                mh.msg_iov = &iov;
                mh.msg_iovlen = 1;
                ssize_t mn = recvmsg(rfd, &mh, MSG_PEEK);
                if (mn < 0) die("recvmsg(MSG_PEEK)");
                if (mn > pn || memcmp(mbuf, pbuf, (size_t)mn) != 0) fail("recvmsg(MSG_PEEK) differs");
                want = (size_t)pn;
                peeked = 1;
            }
        }
        ssize_t n = read(rfd, rbuf, want);
        if (n < 0 && errno != EAGAIN) die("read");
        if (n == 0) out_eof = 1;
        if (n > 0) {
            if (peeked && memcmp(rbuf, pbuf, (size_t)n) != 0) fail("read differs from MSG_PEEK");
            if (write(ofd, rbuf, (size_t)n) != n) die("write OUT");
            got += n;
        }
    }
    if (got != sent) fail("echo returned a different number of bytes");
    close(ifd);
    if (close(ofd) < 0) die("close OUT");
}

/* epfd >= 0: the socket is registered with it for `events` before connect(). */
static int connect_to(const char *host, int port, int epfd, uint32_t events) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) fail("bad HOST");
    set_nonblocking(fd, 1);
    if (epfd >= 0) {
        struct epoll_event ev = {.events = events, .data.fd = fd};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl ADD");
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) die("connect");
    if (epfd >= 0) {
        struct epoll_event ev;
        if (epoll_wait(epfd, &ev, 1, 20000) != 1) fail("epoll_wait: not writable");
        if (ev.data.fd != fd || !(ev.events & EPOLLOUT)) fail("epoll_wait: not this socket's EPOLLOUT");
    } else {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 20000) != 1) fail("poll: connect did not finish");
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) die("SO_ERROR");
    if (err != 0) {
        errno = err;
        die("connect (SO_ERROR)");
    }
    set_nonblocking(fd, 0);
    check_peer(fd, port);
    return fd;
}

/* The epoll-driven echo of mode epoll: the registration made before connect() is the one
 * that must keep working. */
static void run_epoll_echo(int epfd, int fd, const char *in, const char *out) {
    int ifd = open(in, O_RDONLY);
    int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (ifd < 0 || ofd < 0) die("open IN/OUT");
    set_nonblocking(fd, 1);
    struct epoll_event mod = {.events = EPOLLIN | EPOLLOUT, .data.fd = fd};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &mod) < 0) die("epoll_ctl MOD");
    char wbuf[65536], rbuf[65536];
    size_t wlen = 0, woff = 0;
    int in_eof = 0, shut = 0;
    for (;;) {
        if (!in_eof && woff == wlen) {
            ssize_t n = read(ifd, wbuf, sizeof wbuf);
            if (n < 0) die("read IN");
            if (n == 0) in_eof = 1;
            wlen = (size_t)n;
            woff = 0;
        }
        if (in_eof && woff == wlen && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
            struct epoll_event in_only = {.events = EPOLLIN, .data.fd = fd};
            if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &in_only) < 0) die("epoll_ctl MOD");
        }
        struct epoll_event ev;
        int n = epoll_wait(epfd, &ev, 1, 20000);
        if (n != 1) fail("epoll_wait: nothing for 20 s");
        if (woff < wlen) {
            ssize_t w = write(fd, wbuf + woff, wlen - woff);
            if (w < 0 && errno != EAGAIN) die("write");
            if (w > 0) woff += (size_t)w;
        }
        ssize_t r = read(fd, rbuf, sizeof rbuf);
        if (r < 0 && errno != EAGAIN) die("read");
        if (r == 0) break;
        if (r > 0 && write(ofd, rbuf, (size_t)r) != r) die("write OUT");
    }
    close(ifd);
    if (close(ofd) < 0) die("close OUT");
}

/* The echo of mode epollet: an edge-triggered registration made before connect() and never
 * modified, as nginx's; each event, every write and read until EAGAIN. */
static void run_epollet_echo(int epfd, int fd, const char *in, const char *out) {
    int ifd = open(in, O_RDONLY);
    int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (ifd < 0 || ofd < 0) die("open IN/OUT");
    set_nonblocking(fd, 1);
    char wbuf[65536], rbuf[65536];
    size_t wlen = 0, woff = 0;
    int shut = 0;
    for (;;) {
        while (!shut) {
            if (woff == wlen) {
                ssize_t n = read(ifd, wbuf, sizeof wbuf);
                if (n < 0) die("read IN");
                if (n == 0) {
                    if (shutdown(fd, SHUT_WR) < 0) die("shutdown");
                    shut = 1;
                    break;
                }
                wlen = (size_t)n;
                woff = 0;
            }
            ssize_t w = write(fd, wbuf + woff, wlen - woff);
            if (w < 0 && errno == EAGAIN) break;
            if (w < 0) die("write");
            woff += (size_t)w;
        }
        int eof = 0;
        for (;;) {
            ssize_t r = read(fd, rbuf, sizeof rbuf);
            if (r < 0 && errno == EAGAIN) break;
            if (r < 0) die("read");
            if (r == 0) {
                eof = 1;
                break;
            }
            if (write(ofd, rbuf, (size_t)r) != r) die("write OUT");
        }
        if (eof) break;
        struct epoll_event ev;
        int n = epoll_wait(epfd, &ev, 1, 20000);
        if (n != 1) fail("epoll_wait: nothing for 20 s");
        if (ev.data.fd != fd) fail("epoll_wait: another socket's event");
    }
    close(ifd);
    if (close(ofd) < 0) die("close OUT");
}

static void send_fd(int via, int fd) {
    char data = 'F';
    struct iovec iov = {&data, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(via, &mh, 0) != 1) die("sendmsg(SCM_RIGHTS)");
}

static int recv_fd(int via) {
    char data;
    struct iovec iov = {&data, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    if (recvmsg(via, &mh, 0) != 1) die("recvmsg(SCM_RIGHTS)");
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    if (!c || c->cmsg_type != SCM_RIGHTS) fail("no SCM_RIGHTS");
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static int wait_child(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) < 0) die("waitpid");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int client(const char *host, int port, const char *in, const char *out, const char *mode) {
    if (strcmp(mode, "epoll") == 0 || strcmp(mode, "epollet") == 0) {
        int epfd = epoll_create1(EPOLL_CLOEXEC);
        if (epfd < 0) die("epoll_create1");
        if (strcmp(mode, "epoll") == 0) {
            int fd = connect_to(host, port, epfd, EPOLLOUT);
            run_epoll_echo(epfd, fd, in, out);
            return close(fd) < 0 ? 2 : 0;
        }
        int fd = connect_to(host, port, epfd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
        run_epollet_echo(epfd, fd, in, out);
        return close(fd) < 0 ? 2 : 0;
    }
    int fd = connect_to(host, port, -1, 0);
    if (strcmp(mode, "blast") == 0) {
        int ifd = open(in, O_RDONLY);
        if (ifd < 0) die("open IN");
        char buf[65536];
        for (;;) {
            ssize_t n = read(ifd, buf, sizeof buf);
            if (n < 0) die("read IN");
            if (n == 0) break;
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(fd, buf + off, (size_t)(n - off));
                if (w < 0) die("write");
                off += w;
            }
        }
        /* What the kernel would deliver after the process is gone must arrive. */
        exit(0);
    }
    if (strcmp(mode, "plain") == 0) {
        run_echo(fd, fd, in, out, 0);
    } else if (strcmp(mode, "peek") == 0) {
        run_echo(fd, fd, in, out, 1);
    } else if (strcmp(mode, "dup") == 0) {
        int a = dup(fd);
        int b = fcntl(fd, F_DUPFD_CLOEXEC, 100);
        if (a < 0 || b < 100) die("dup/F_DUPFD_CLOEXEC");
        if (dup2(fd, 50) != 50) die("dup2");
        if (dup3(fd, 60, O_CLOEXEC) != 60) die("dup3");
        if (close(fd) < 0) die("close original");
        check_peer(a, port);
        check_peer(b, port);
        check_peer(50, port);
        check_peer(60, port);
        close(a);
        close(b);
        /* Writes on one copy, reads on another: one connection. */
        run_echo(50, 60, in, out, 0);
        close(60);
        fd = 50;
    } else if (strcmp(mode, "scm") == 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            close(sv[0]);
            close(fd);
            int got = recv_fd(sv[1]);
            run_echo(got, got, in, out, 0);
            _exit(close(got) < 0 ? 2 : 0);
        }
        close(sv[1]);
        send_fd(sv[0], fd);
        close(fd);
        close(sv[0]);
        return wait_child(pid);
    } else if (strcmp(mode, "exec") == 0) {
        /* Clear CLOEXEC: the exec'd program inherits the connection. */
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0 || fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) < 0) die("F_SETFD");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            char num[16];
            snprintf(num, sizeof num, "%d", fd);
            execl(self_path, "echo", "run", num, in, out, (char *)NULL);
            die("execl");
        }
        close(fd);
        return wait_child(pid);
    } else {
        fail("unknown MODE");
    }
    return close(fd) < 0 ? 2 : 0;
}

static void echo_child(int fd) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) die("server read");
        if (n == 0) break;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(fd, buf + off, (size_t)(n - off));
            if (w < 0) die("server write");
            off += w;
        }
    }
    shutdown(fd, SHUT_WR);
    close(fd);
}

static int server(int port, int count) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) die("socket");
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(l, 64) < 0) die("listen");
    pid_t kids[256];
    int n = 0;
    for (; n < count && n < 256; n++) {
        int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) die("accept4");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            close(l);
            echo_child(c);
            _exit(0);
        }
        kids[n] = pid;
        close(c);
    }
    close(l);
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (wait_child(kids[i]) != 0) rc = 4;
    return rc;
}

static int sink(int port, const char *out) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) die("socket");
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(l, 4) < 0) die("listen");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (ofd < 0) die("open OUT");
    char buf[65536];
    for (;;) {
        ssize_t n = read(c, buf, sizeof buf);
        if (n < 0) die("read");
        if (n == 0) break;
        if (write(ofd, buf, (size_t)n) != n) die("write OUT");
    }
    return close(ofd) < 0 ? 2 : 0;
}

int main(int argc, char **argv) {
    self_path = argv[0];
    /* As network programs do: a write to a reset connection is an EPIPE error, not a death. */
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && strcmp(argv[1], "server") == 0) return server(atoi(argv[2]), atoi(argv[3]));
    if (argc == 7 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), argv[4], argv[5], argv[6]);
    if (argc == 4 && strcmp(argv[1], "sink") == 0) return sink(atoi(argv[2]), argv[3]);
    if (argc == 5 && strcmp(argv[1], "run") == 0) {
        int fd = atoi(argv[2]);
        run_echo(fd, fd, argv[3], argv[4], 0);
        return close(fd) < 0 ? 2 : 0;
    }
    fprintf(stderr, "usage: echo server PORT COUNT | echo client HOST PORT IN OUT MODE\n");
    return 64;
}
