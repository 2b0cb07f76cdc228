/* One socketpair stage of the shim's data path, measured alone: how fast a writer moves bytes
 * from a 1 MiB buffer (the ring) through an AF_UNIX stream socketpair to a reading thread.
 * Recorded in docs/benchmarks.md ("The receive side's copy into the socketpair").
 *
 *   cc -O2 -o /tmp/stage tests/softroce/benches/socketpair_stage.c -lpthread
 *   /tmp/stage 2 0        semantics: is a vmsplice+splice zero-copy (the reader sees bytes
 *                         changed after the splice)? what SIOCOUTQ says while the reader reads
 *   /tmp/stage 0 MIB      write() of 256 KiB pieces (a copy into the socket, as the engine does)
 *   /tmp/stage 1 MIB      vmsplice() of the same pieces into a pipe, splice() into the socket
 *
 * In the Soft-RoCE guest: put the two commands in a script and run it with
 *   cargo run -p rdma-streams-softroce --example guest -- -- bash SCRIPT
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RING (1 << 20)
#define CHUNK (256 << 10)

static int rd;
static size_t total;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* The app: reads until `total` bytes or EOF; returns the byte count. */
static void *reader(void *unused)
{
	char *buf = malloc(RING);
	size_t got = 0;

	(void)unused;
	if (!buf)
		die("malloc");
	while (got < total) {
		ssize_t n = read(rd, buf, RING);
		if (n <= 0)
			break;
		got += n;
	}
	free(buf);
	return (void *)got;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int outq(int fd)
{
	int q = -1;

	if (ioctl(fd, SIOCOUTQ, &q) < 0)
		die("SIOCOUTQ");
	return q;
}

/* Mode 2: is vmsplice+splice zero-copy, and what does SIOCOUTQ say while the reader reads? */
static int semantics(int sv[2], char *ring)
{
	int p[2];
	char x[4096];
	struct iovec v = { ring, sizeof(x) };
	ssize_t a, b;

	if (pipe(p) < 0)
		die("pipe");
	a = vmsplice(p[1], &v, 1, 0);
	b = splice(p[0], NULL, sv[0], NULL, sizeof(x), 0);
	printf("vmsplice %zd splice %zd outq %d\n", a, b, outq(sv[0]));
	memset(ring, 'b', sizeof(x));
	if (read(sv[1], x, sizeof(x)) != (ssize_t)sizeof(x))
		die("read");
	printf("reader sees %c (a=copied, b=zero-copy)\n", x[0]);
	printf("outq after read %d\n", outq(sv[0]));
	v.iov_len = 65536;
	if (vmsplice(p[1], &v, 1, 0) < 0)
		die("vmsplice");
	b = splice(p[0], NULL, sv[0], NULL, 65536, 0);
	printf("64k spliced %zd outq %d\n", b, outq(sv[0]));
	if (read(sv[1], x, sizeof(x)) < 0)
		die("read");
	printf("after 4k read outq %d\n", outq(sv[0]));
	for (;;) {
		int inq = 0;

		if (ioctl(sv[1], FIONREAD, &inq) < 0)
			die("FIONREAD");
		if (!inq)
			break;
		if (read(sv[1], x, inq > (int)sizeof(x) ? sizeof(x) : (size_t)inq) < 0)
			die("read");
		printf(" inq %d -> outq %d\n", inq, outq(sv[0]));
	}
	return 0;
}

/* Mode 1: one piece through vmsplice into the pipe and splice into the socket. */
static size_t splice_piece(int p[2], int sock, char *at)
{
	struct iovec v = { at, CHUNK };
	ssize_t n = vmsplice(p[1], &v, 1, 0), m = 0;

	if (n <= 0)
		die("vmsplice");
	while (m < n) {
		ssize_t k = splice(p[0], NULL, sock, NULL, n - m, 0);
		if (k <= 0)
			die("splice");
		m += k;
	}
	return n;
}

int main(int argc, char **argv)
{
	int mode, sv[2], p[2];
	size_t sent = 0, off = 0;
	char *ring;
	pthread_t t;
	void *got;
	double t0, dt;

	if (argc != 3 || (mode = atoi(argv[1])) < 0 || mode > 2) {
		fprintf(stderr, "usage: %s 0|1|2 MIB\n", argv[0]);
		return 2;
	}
	total = (size_t)atol(argv[2]) << 20;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
		die("socketpair");
	rd = sv[1];
	ring = mmap(NULL, RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ring == MAP_FAILED)
		die("mmap");
	memset(ring, 'a', RING);
	if (mode == 2)
		return semantics(sv, ring);
	if (pthread_create(&t, NULL, reader, NULL))
		die("pthread_create");
	if (pipe(p) < 0)
		die("pipe");
	fcntl(p[1], F_SETPIPE_SZ, RING);
	t0 = now();
	while (sent < total) {
		size_t n;

		if (mode == 0) {
			ssize_t w = write(sv[0], ring + off, CHUNK);
			if (w <= 0)
				die("write");
			n = w;
		} else {
			n = splice_piece(p, sv[0], ring + off);
		}
		sent += n;
		off = (off + n) % RING;
	}
	pthread_join(t, &got);
	dt = now() - t0;
	printf("mode %d: %zu MiB in %.3f s = %.1f MiB/s\n", mode, (size_t)got >> 20, dt,
	       ((size_t)got >> 20) / dt);
	return 0;
}
