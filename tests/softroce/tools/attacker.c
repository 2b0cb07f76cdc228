/*
 * attacker: an RDMA peer without the shim, speaking rdma-streams' wire protocol by hand
 * (librdmacm and libibverbs, RDMA_PS_IB) and breaking its rules on purpose. The Soft-RoCE
 * attack scenarios (tests/softroce/tests/scenarios/attacks.rs) script it; docs/security.md
 * says what each attack shows.
 *
 *   attacker STEP [STEP...]      steps run in order; every result is one line on stdout
 *
 * Steps (NAME: a connection of this run; times in milliseconds):
 *   connect NAME HOST PORT SRC CLIENT   RDMA connect from SRC to HOST:PORT whose HELLO names
 *                                       CLIENT, "IP:PORT" (someone else's TCP address) or
 *                                       "own" (a TCP socket of ours bound to SRC, connected
 *                                       later by `tcp`); prints "NAME established ring ADDR
 *                                       RKEY LOG" or "NAME rejected STATUS" / "NAME error ..."
 *   tcp NAME HOST PORT                  the kernel TCP connect of an "own" connection
 *   wait_claim NAME MS                  "NAME claim HEX" or "NAME no-claim"
 *   prove NAME                          writes the CLAIM's secret on the TCP connection
 *   confirm NAME                        posts CONFIRM (whether or not CLAIM came)
 *   urgent NAME POS                     posts URGENT naming stream position POS (a lie when POS
 *                                       is not where the next write starts)
 *   switch NAME POS                     posts SWITCH naming stream position POS (a lie when no
 *                                       ring was offered, or POS is not the next write's start)
 *   write NAME TEXT                     an RDMA WRITE WITH IMMEDIATE of TEXT at the stream's
 *                                       next position, with the right immediate
 *   write_imm NAME TEXT IMM             a write of TEXT ("-": none) at the next position with the
 *                                       immediate IMM (a lie: a zero-length write claiming
 *                                       bytes, a replayed position)
 *   write_raw NAME ADDR RKEY LEN IMM    a write of LEN bytes ("x") to any address and key
 *   write_to NAME OTHER                 a write through NAME's QP into OTHER's peer ring, with
 *                                       OTHER's key
 *   tcp_send NAME TEXT / tcp_recv NAME MS   the TCP connection (prints "NAME tcp-got ...")
 *   recv NAME MS                        prints what the peer wrote ("NAME got ...")
 *   fin NAME                            posts FIN (the end of our side of the stream)
 *   reuse NAME CLIENT                   posts REUSE with a HELLO naming CLIENT ("IP:PORT", or
 *                                       "own": a new TCP socket of ours on NAME's source
 *                                       address): asks for the next connection on NAME's queue
 *                                       pair; the stream starts anew (positions 0, no CLAIM);
 *                                       the answer shows as "NAME control 10" (REUSED) or
 *                                       "NAME disconnected"
 *   disconnect NAME
 *   sleep MS
 *   wait_file PATH MS                   until PATH exists (another program's cue), at most MS
 *   raw_connect NAME HOST PORT SRC HEX  an RDMA connect whose app payload (after the transport's
 *                                       header) is the bytes HEX (a gateway's request, say);
 *                                       prints "NAME established|rejected ... payload HEX" with
 *                                       the peer's answer
 *   flood HOST PORT SRC N HOLD_MS       N connect requests with HELLOs for random ports of SRC,
 *                                       none ever completed (no QP, no RTU); prints the count
 *                                       of accepts, rejects and errors
 *   listen NAME HOST PORT MS            an RDMA listener at HOST:PORT ("NAME listening") that
 *                                       accepts the first HELLO as the shim's server would,
 *                                       never sends CLAIM, holds the connection MS; prints
 *                                       "NAME accepted client IP:PORT", then "NAME claimed 0,
 *                                       got N bytes" (what the client wrote on the stream)
 * Every posted write waits for its completion: "NAME write-status N" (0: success, 10: remote
 * access error).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 16
#define RING_LOG 20
#define RING (1u << RING_LOG)
#define RECVS 32
#define CTRL 48
#define SECRET 16
/* Work request ids: receives are their slot (below RECVS); sends are these. An error
 * completion's opcode is undefined, so the id tells a write's from a flushed receive's. */
#define WR_WRITE 0x1000
#define WR_CONTROL 0x2000

struct conn {
	char name[32];
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *mem; /* ring, then receive slots, then send slots */
	int established, rejected, disconnected;
	uint64_t peer_addr;
	uint32_t peer_rkey;
	uint8_t peer_log;
	uint64_t sent;       /* stream position */
	uint64_t controls;
	uint64_t got;        /* bytes the peer wrote */
	uint8_t secret[SECRET];
	int claimed;
	int tcp;             /* our TCP socket ("own"), -1 otherwise */
	int last_status;
	int write_done;
	uint8_t answer[64]; /* the peer's app payload (accept or reject) */
	int answer_len;
};

static struct conn conns[MAX_CONNS];
static int nconns;
static struct rdma_event_channel *channel;

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void die(const char *what)
{
	out("fatal %s: %s", what, strerror(errno));
	exit(2);
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct conn *find(const char *name)
{
	for (int i = 0; i < nconns; i++)
		if (!strcmp(conns[i].name, name))
			return &conns[i];
	out("fatal no connection %s", name);
	exit(2);
}

static struct conn *by_id(struct rdma_cm_id *id)
{
	for (int i = 0; i < nconns; i++)
		if (conns[i].id == id)
			return &conns[i];
	return NULL;
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = v & 0xff;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 3; i >= 0; i--, v >>= 8)
		p[i] = v & 0xff;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static void post_recv(struct conn *c, uint64_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->mem + RING + slot * CTRL),
		.length = CTRL,
		.lkey = c->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->id->qp, &wr, &bad))
		die("ibv_post_recv");
}

/* Takes every completion of every connection, and (unless `cq_only`) every CM event, for up
 * to `ms`. Waiting for a write's own completion takes no CM event: librdmacm moves the QP to
 * the error state when it hands out DISCONNECTED, which would flush the write before the
 * peer's NAK says why it failed. */
static void pump_events(int ms, int cq_only)
{
	uint64_t end = now_ms() + ms;
	do {
		struct pollfd p = { .fd = channel->fd, .events = POLLIN };
		if (cq_only) {
			usleep(1000);
			p.revents = 0;
		} else {
			poll(&p, 1, 1);
		}
		struct rdma_cm_event *ev;
		while (p.revents && rdma_get_cm_event(channel, &ev) == 0) {
			struct conn *c = by_id(ev->id);
			int kind = ev->event;
			if (c && kind == RDMA_CM_EVENT_ESTABLISHED) {
				const uint8_t *d = ev->param.conn.private_data;
				if (d && ev->param.conn.private_data_len >= 20 && d[0] == 'R' && d[1] == 'S') {
					c->peer_addr = get64(d + 4);
					c->peer_rkey = (uint32_t)d[12] << 24 | d[13] << 16 | d[14] << 8 | d[15];
					c->peer_log = d[16];
					if (20 + d[19] <= ev->param.conn.private_data_len && d[19] <= sizeof(c->answer)) {
						memcpy(c->answer, d + 20, d[19]);
						c->answer_len = d[19];
					}
				}
				c->established = 1;
			} else if (c && (kind == RDMA_CM_EVENT_REJECTED || kind == RDMA_CM_EVENT_UNREACHABLE ||
					 kind == RDMA_CM_EVENT_CONNECT_ERROR)) {
				const uint8_t *d = ev->param.conn.private_data;
				if (kind == RDMA_CM_EVENT_REJECTED && d && ev->param.conn.private_data_len >= 20 &&
				    d[0] == 'R' && d[1] == 'S' && 20 + d[19] <= ev->param.conn.private_data_len &&
				    d[19] <= sizeof(c->answer)) {
					memcpy(c->answer, d + 20, d[19]);
					c->answer_len = d[19];
				}
				c->rejected = kind == RDMA_CM_EVENT_REJECTED ? (ev->status ? ev->status : -1) : -1000 - kind;
			} else if (c && kind == RDMA_CM_EVENT_DISCONNECTED) {
				c->disconnected = 1;
				out("%s disconnected", c->name);
			}
			rdma_ack_cm_event(ev);
			p.revents = POLLIN;
			if (poll(&p, 1, 0) <= 0)
				break;
		}
		for (int i = 0; i < nconns; i++) {
			struct conn *c = &conns[i];
			struct ibv_wc wc[16];
			int n;
			if (!c->cq)
				continue;
			while ((n = ibv_poll_cq(c->cq, 16, wc)) > 0) {
				for (int k = 0; k < n; k++) {
					if (wc[k].wr_id < RECVS) {
						if (wc[k].status) {
							continue;
						}
						if (wc[k].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
							uint64_t off = c->got % RING;
							uint32_t len = wc[k].byte_len;
							char text[256];
							uint32_t show = len < sizeof(text) - 1 ? len : sizeof(text) - 1;
							if (off + show > RING)
								show = RING - off;
							memcpy(text, c->mem + off, show);
							text[show] = 0;
							for (uint32_t j = 0; j < show; j++)
								if (text[j] < 32 || text[j] > 126)
									text[j] = '.';
							c->got += len;
							out("%s got %u bytes: %s", c->name, len, text);
						} else {
							const uint8_t *m = c->mem + RING + wc[k].wr_id * CTRL;
							if (m[0] == 3) {
								memcpy(c->secret, m + 24, SECRET);
								c->claimed = 1;
							}
							out("%s control %d", c->name, m[0]);
						}
						post_recv(c, wc[k].wr_id);
					} else if (!c->write_done) {
						/* The first completion of the send: flushes come after. */
						c->last_status = wc[k].status;
						c->write_done = 1;
					}
				}
			}
		}
	} while (now_ms() < end);
}

static void pump(int ms)
{
	pump_events(ms, 0);
}

static struct conn *add(const char *name)
{
	if (nconns == MAX_CONNS) {
		out("fatal too many connections");
		exit(2);
	}
	struct conn *c = &conns[nconns++];
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%s", name);
	c->tcp = -1;
	return c;
}

static void parse_addr(const char *text, struct sockaddr_in *sa)
{
	char ip[64];
	const char *colon = strrchr(text, ':');
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	if (colon) {
		snprintf(ip, sizeof(ip), "%.*s", (int)(colon - text), text);
		sa->sin_port = htons(atoi(colon + 1));
	} else {
		snprintf(ip, sizeof(ip), "%s", text);
	}
	if (inet_pton(AF_INET, ip, &sa->sin_addr) != 1) {
		out("fatal bad address %s", text);
		exit(2);
	}
}

/* The connection's PD, CQ, region (ring, then receive and send slots) and QP on its id's
 * device, with every receive posted. */
static void setup_verbs(struct conn *c)
{
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = ibv_create_cq(c->id->verbs, 2 * RECVS + 64, NULL, NULL, 0);
	c->mem = aligned_alloc(4096, RING + 2 * RECVS * CTRL + 4096);
	memset(c->mem, 0, RING + 2 * RECVS * CTRL);
	c->mr = ibv_reg_mr(c->pd, c->mem, RING + 2 * RECVS * CTRL,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp_init_attr qa = {
		.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!c->pd || !c->cq || !c->mr || rdma_create_qp(c->id, c->pd, &qa))
		die("verbs setup");
	for (uint64_t s = 0; s < RECVS; s++)
		post_recv(c, s);
}

/* The transport header (version 5) and the shim's HELLO naming `client`. */
static int hello(struct conn *c, const struct sockaddr_in *client, uint8_t *pd)
{
	memset(pd, 0, 56);
	pd[0] = 'R';
	pd[1] = 'S';
	pd[2] = 5;
	pd[3] = 1;
	put64(pd + 4, c ? (uintptr_t)c->mem : 0);
	put32(pd + 12, c ? c->mr->rkey : 0);
	pd[16] = RING_LOG;
	pd[17] = 0;
	pd[18] = RECVS;
	uint8_t *h = pd + 20;
	h[0] = 'S';
	h[1] = 1;
	h[2] = 0;
	put64(h + 3, ((uint64_t)rand() << 32) | (uint64_t)rand());
	h[11] = 4;
	memcpy(h + 12, &client->sin_port, 2);
	memcpy(h + 14, &client->sin_addr, 4);
	pd[19] = 18;
	return 38;
}

static int resolve(struct rdma_cm_id *id, struct sockaddr_in *src, struct sockaddr_in *dst)
{
	if (rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, 2000))
		return -1;
	struct rdma_cm_event *ev;
	for (int step = 0; step < 2; step++) {
		if (rdma_get_cm_event(channel, &ev))
			return -1;
		int kind = ev->event;
		rdma_ack_cm_event(ev);
		if (kind == RDMA_CM_EVENT_ADDR_RESOLVED) {
			if (rdma_resolve_route(id, 2000))
				return -1;
		} else if (kind != RDMA_CM_EVENT_ROUTE_RESOLVED) {
			return -1;
		}
	}
	return 0;
}

/* The payload of the next connect instead of a HELLO (raw_connect), and its length. */
static uint8_t raw_payload[36];
static int raw_len = -1;

static void hex_answer(const struct conn *c, char *out)
{
	for (int k = 0; k < c->answer_len; k++)
		sprintf(out + 2 * k, "%02x", c->answer[k]);
	out[2 * c->answer_len] = 0;
}

static void step_connect(char **a)
{
	struct conn *c = add(a[0]);
	struct sockaddr_in dst, src, client;
	char hp[128];
	snprintf(hp, sizeof(hp), "%s:%s", a[1], a[2]);
	parse_addr(hp, &dst);
	parse_addr(a[3], &src);
	if (!strcmp(a[4], "own")) {
		c->tcp = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in b = src;
		b.sin_port = 0;
		socklen_t len = sizeof(client);
		if (c->tcp < 0 || bind(c->tcp, (struct sockaddr *)&b, sizeof(b)) ||
		    getsockname(c->tcp, (struct sockaddr *)&client, &len))
			die("binding the TCP socket");
	} else {
		parse_addr(a[4], &client);
	}
	/* The blocking resolve below needs events in order: a separate channel per connect. */
	struct rdma_event_channel *own = rdma_create_event_channel();
	struct rdma_event_channel *shared = channel;
	channel = own;
	if (!own || rdma_create_id(own, &c->id, c, RDMA_PS_IB))
		die("rdma_create_id");
	if (resolve(c->id, &src, &dst)) {
		out("%s error resolve", c->name);
		channel = shared;
		return;
	}
	setup_verbs(c);
	uint8_t pd[56];
	struct rdma_conn_param p = { .retry_count = 6, .rnr_retry_count = 7, .flow_control = 1 };
	p.private_data = pd;
	p.private_data_len = hello(c, &client, pd);
	if (raw_len >= 0) {
		memcpy(pd + 20, raw_payload, raw_len);
		pd[19] = raw_len;
		p.private_data_len = 20 + raw_len;
		raw_len = -1;
	}
	if (rdma_connect(c->id, &p))
		die("rdma_connect");
	uint64_t end = now_ms() + 10000;
	while (!c->established && !c->rejected && now_ms() < end)
		pump(10);
	/* Later events (DISCONNECTED) of this id come on its own channel: merge by polling both. */
	channel = shared;
	rdma_migrate_id(c->id, channel);
	rdma_destroy_event_channel(own);
	char answer[2 * sizeof(c->answer) + 1];
	hex_answer(c, answer);
	if (c->established)
		out("%s established ring 0x%llx 0x%x %u client %s:%u payload %s", c->name,
		    (unsigned long long)c->peer_addr, c->peer_rkey, c->peer_log,
		    inet_ntoa(client.sin_addr), ntohs(client.sin_port), answer);
	else if (c->rejected)
		out("%s rejected %d payload %s", c->name, c->rejected, answer);
	else
		out("%s error timeout", c->name);
}

/* listen NAME HOST PORT MS: a listener at HOST:PORT in the shim's port space that accepts the
 * first connect request as the shim's server would (ACCEPT with its HELLO's nonce and a ring
 * of ours), prints "NAME accepted client IP:PORT", never sends CLAIM, holds the connection MS
 * and disconnects. */
static void step_listen(char **a)
{
	struct conn *c = add(a[0]);
	struct sockaddr_in sa;
	char hp[128];
	snprintf(hp, sizeof(hp), "%s:%s", a[1], a[2]);
	parse_addr(hp, &sa);
	struct rdma_event_channel *own = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	if (!own || rdma_create_id(own, &lid, NULL, RDMA_PS_IB) ||
	    rdma_bind_addr(lid, (struct sockaddr *)&sa) || rdma_listen(lid, 4))
		die("listening");
	out("%s listening", c->name);
	struct rdma_cm_event *ev = NULL;
	uint64_t end = now_ms() + 60000;
	while (now_ms() < end) {
		struct pollfd p = { .fd = own->fd, .events = POLLIN };
		if (poll(&p, 1, 100) <= 0)
			continue;
		if (rdma_get_cm_event(own, &ev))
			die("rdma_get_cm_event");
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		rdma_ack_cm_event(ev);
		ev = NULL;
	}
	if (!ev) {
		out("%s no-request", c->name);
		return;
	}
	const uint8_t *d = ev->param.conn.private_data;
	uint8_t nonce[8] = { 0 };
	struct sockaddr_in client = { .sin_family = AF_INET };
	if (d && ev->param.conn.private_data_len >= 20 + 18 && d[0] == 'R' && d[1] == 'S' &&
	    d[20] == 'S' && d[21] == 1) {
		c->peer_addr = get64(d + 4);
		c->peer_rkey = (uint32_t)d[12] << 24 | d[13] << 16 | d[14] << 8 | d[15];
		c->peer_log = d[16];
		memcpy(nonce, d + 23, 8);
		memcpy(&client.sin_port, d + 32, 2);
		memcpy(&client.sin_addr, d + 34, 4);
	}
	c->id = ev->id;
	c->id->context = c;
	rdma_ack_cm_event(ev);
	setup_verbs(c);
	uint8_t pd[56];
	memset(pd, 0, sizeof(pd));
	pd[0] = 'R';
	pd[1] = 'S';
	pd[2] = 5;
	pd[3] = 2;
	put64(pd + 4, (uintptr_t)c->mem);
	put32(pd + 12, c->mr->rkey);
	pd[16] = RING_LOG;
	pd[18] = RECVS;
	pd[19] = 10;
	pd[20] = 'S';
	pd[21] = 2;
	memcpy(pd + 22, nonce, 8);
	struct rdma_conn_param p = { .retry_count = 6, .rnr_retry_count = 7, .flow_control = 1 };
	p.private_data = pd;
	p.private_data_len = 30;
	/* Its events (ESTABLISHED, DISCONNECTED) come on the shared channel, as a connect's do. */
	if (rdma_migrate_id(c->id, channel) || rdma_accept(c->id, &p))
		die("rdma_accept");
	end = now_ms() + 10000;
	while (!c->established && now_ms() < end)
		pump(10);
	out("%s %s client %s:%u", c->name, c->established ? "accepted" : "not-established",
	    inet_ntoa(client.sin_addr), ntohs(client.sin_port));
	pump(atoi(a[3]));
	rdma_disconnect(c->id);
	out("%s claimed %d, got %llu bytes", c->name, c->claimed, (unsigned long long)c->got);
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(own);
}

static void post_write(struct conn *via, uint64_t raddr, uint32_t rkey, const void *data,
		       uint32_t len, uint32_t imm)
{
	uint8_t *src = via->mem + RING + RECVS * CTRL; /* a scratch area in our own region */
	if (len > RECVS * CTRL)
		len = RECVS * CTRL;
	memcpy(src, data, len);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = via->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = WR_WRITE,
		.sg_list = len ? &sge : NULL,
		.num_sge = len ? 1 : 0,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(imm),
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	via->write_done = 0;
	if (ibv_post_send(via->id->qp, &wr, &bad)) {
		out("%s write-post-failed", via->name);
		return;
	}
	uint64_t end = now_ms() + 15000;
	while (!via->write_done && now_ms() < end)
		pump_events(5, 1);
	out("%s write-status %d", via->name, via->write_done ? via->last_status : -1);
}

/* The send slot a control message is written into before send_control posts it. */
static uint8_t *control_slot(struct conn *c)
{
	uint8_t *m = c->mem + RING + RECVS * CTRL;
	memset(m, 0, CTRL);
	return m;
}

/* Posts the control message in the send slot (signaled) and waits for its completion:
 * "NAME WHAT-status N" (-1: none came). */
static void send_control(struct conn *c, const char *what)
{
	uint8_t *m = c->mem + RING + RECVS * CTRL;
	struct ibv_sge sge = { .addr = (uintptr_t)m, .length = CTRL, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = WR_CONTROL, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	c->write_done = 0;
	if (ibv_post_send(c->id->qp, &wr, &bad)) {
		out("%s control-post-failed", c->name);
		return;
	}
	c->controls++;
	uint64_t end = now_ms() + 15000;
	while (!c->write_done && now_ms() < end)
		pump(5);
	out("%s %s-status %d", c->name, what, c->write_done ? c->last_status : -1);
}

static void post_control_at(struct conn *c, uint8_t type, uint64_t position)
{
	uint8_t *m = control_slot(c);
	m[0] = type;
	if (type == 5)
		put64(m + 24, position);
	send_control(c, "control");
}

static void post_control(struct conn *c, uint8_t type)
{
	post_control_at(c, type, 0);
}

/* reuse NAME CLIENT: REUSE (type 9: no counters, byte 1 the payload's length, the payload
 * from byte 8) with a HELLO naming CLIENT. */
static void step_reuse(char **a)
{
	struct conn *c = find(a[0]);
	struct sockaddr_in client;
	if (!strcmp(a[1], "own")) {
		struct sockaddr_in b = *(struct sockaddr_in *)rdma_get_local_addr(c->id);
		b.sin_port = 0;
		socklen_t len = sizeof(client);
		if (c->tcp >= 0)
			close(c->tcp);
		c->tcp = socket(AF_INET, SOCK_STREAM, 0);
		if (c->tcp < 0 || bind(c->tcp, (struct sockaddr *)&b, sizeof(b)) ||
		    getsockname(c->tcp, (struct sockaddr *)&client, &len))
			die("binding the TCP socket");
	} else {
		parse_addr(a[1], &client);
	}
	uint8_t pd[56];
	hello(NULL, &client, pd);
	uint8_t *m = control_slot(c);
	m[0] = 9;
	m[1] = pd[19];
	memcpy(m + 8, pd + 20, pd[19]);
	out("%s reuse client %s:%u", c->name, inet_ntoa(client.sin_addr), ntohs(client.sin_port));
	/* The next connection on this queue pair starts at stream position 0, unclaimed. */
	c->sent = 0;
	c->got = 0;
	c->claimed = 0;
	c->controls = 0;
	send_control(c, "reuse");
}

static void step_flood(char **a)
{
	struct sockaddr_in dst, src, client;
	char hp[128];
	int n = atoi(a[3]), hold = atoi(a[4]);
	snprintf(hp, sizeof(hp), "%s:%s", a[0], a[1]);
	parse_addr(hp, &dst);
	parse_addr(a[2], &src);
	client = src;
	int accepted = 0, rejected = 0, errors = 0, sent = 0;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id **ids = calloc(n, sizeof(*ids));
	if (!ch || !ids)
		die("flood setup");
	for (int i = 0; i < n; i++) {
		if (rdma_create_id(ch, &ids[i], NULL, RDMA_PS_IB) ||
		    rdma_resolve_addr(ids[i], (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000)) {
			errors++;
			continue;
		}
	}
	/* Drive every id: resolved -> route -> connect (a made-up QP number: no QP, no RTU). */
	uint64_t end = now_ms() + hold;
	while (now_ms() < end) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, 20) <= 0)
			continue;
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev))
			continue;
		struct rdma_cm_id *id = ev->id;
		int kind = ev->event;
		rdma_ack_cm_event(ev);
		if (kind == RDMA_CM_EVENT_ADDR_RESOLVED) {
			if (rdma_resolve_route(id, 2000))
				errors++;
		} else if (kind == RDMA_CM_EVENT_ROUTE_RESOLVED) {
			uint8_t pd[56];
			client.sin_port = htons(1024 + rand() % 60000);
			/* A made-up QP number from the top of the 24-bit space, far from the ones rxe
			 * hands out: a request that reuses a live connection's number from the same
			 * address makes the kernel's CM tear that connection down as stale (another
			 * attack, docs/security.md), which this one is not about. */
			struct rdma_conn_param cp = { .retry_count = 6, .rnr_retry_count = 7,
						      .qp_num = 0xf00000 + sent };
			cp.private_data = pd;
			cp.private_data_len = hello(NULL, &client, pd);
			if (rdma_connect(id, &cp))
				errors++;
			else
				sent++;
		} else if (kind == RDMA_CM_EVENT_CONNECT_RESPONSE || kind == RDMA_CM_EVENT_ESTABLISHED) {
			accepted++;
		} else if (kind == RDMA_CM_EVENT_REJECTED) {
			rejected++;
		} else {
			errors++;
		}
	}
	out("flood sent %d accepted %d rejected %d errors %d", sent, accepted, rejected, errors);
	for (int i = 0; i < n; i++)
		if (ids[i])
			rdma_destroy_id(ids[i]);
	rdma_destroy_event_channel(ch);
	free(ids);
}

int main(int argc, char **argv)
{
	srand(time(NULL) ^ getpid());
	channel = rdma_create_event_channel();
	if (!channel)
		die("rdma_create_event_channel");
	int i = 1;
	while (i < argc) {
		const char *s = argv[i++];
		char **a = argv + i;
		int left = argc - i;
#define NEED(n)                                                    \
	do {                                                       \
		if (left < (n)) {                                  \
			out("fatal %s needs %d arguments", s, (n)); \
			return 2;                                  \
		}                                                  \
		i += (n);                                          \
	} while (0)
		if (!strcmp(s, "connect")) {
			NEED(5);
			step_connect(a);
		} else if (!strcmp(s, "tcp")) {
			NEED(3);
			struct conn *c = find(a[0]);
			struct sockaddr_in dst;
			char hp[128];
			snprintf(hp, sizeof(hp), "%s:%s", a[1], a[2]);
			parse_addr(hp, &dst);
			if (c->tcp < 0 || connect(c->tcp, (struct sockaddr *)&dst, sizeof(dst)))
				out("%s tcp-failed %s", c->name, strerror(errno));
			else
				out("%s tcp-connected", c->name);
		} else if (!strcmp(s, "wait_claim")) {
			NEED(2);
			struct conn *c = find(a[0]);
			uint64_t end = now_ms() + atoi(a[1]);
			while (!c->claimed && now_ms() < end)
				pump(5);
			if (c->claimed) {
				char hex[2 * SECRET + 1];
				for (int k = 0; k < SECRET; k++)
					sprintf(hex + 2 * k, "%02x", c->secret[k]);
				out("%s claim %s", c->name, hex);
			} else {
				out("%s no-claim", c->name);
			}
		} else if (!strcmp(s, "prove")) {
			NEED(1);
			struct conn *c = find(a[0]);
			ssize_t n = c->tcp < 0 ? -1 : send(c->tcp, c->secret, SECRET, MSG_NOSIGNAL);
			out("%s proved %zd", c->name, n);
		} else if (!strcmp(s, "confirm")) {
			NEED(1);
			post_control(find(a[0]), 4);
		} else if (!strcmp(s, "fin")) {
			NEED(1);
			post_control(find(a[0]), 2);
		} else if (!strcmp(s, "reuse")) {
			NEED(2);
			step_reuse(a);
		} else if (!strcmp(s, "urgent")) {
			NEED(2);
			post_control_at(find(a[0]), 5, strtoull(a[1], NULL, 0));
		} else if (!strcmp(s, "switch")) {
			NEED(2);
			post_control_at(find(a[0]), 7, strtoull(a[1], NULL, 0));
		} else if (!strcmp(s, "write")) {
			NEED(2);
			struct conn *c = find(a[0]);
			uint32_t len = strlen(a[1]);
			uint64_t ring = 1ull << c->peer_log;
			post_write(c, c->peer_addr + c->sent % ring, c->peer_rkey, a[1], len,
				   (uint32_t)(c->sent + len));
			c->sent += len;
		} else if (!strcmp(s, "write_imm")) {
			NEED(3);
			struct conn *c = find(a[0]);
			const char *text = strcmp(a[1], "-") ? a[1] : "";
			uint32_t len = strlen(text);
			uint64_t ring = 1ull << c->peer_log;
			post_write(c, c->peer_addr + c->sent % ring, c->peer_rkey, text, len,
				   strtoul(a[2], NULL, 0));
			c->sent += len;
		} else if (!strcmp(s, "write_raw")) {
			NEED(5);
			struct conn *c = find(a[0]);
			char x[4096];
			uint32_t len = strtoul(a[3], NULL, 0);
			memset(x, 'x', sizeof(x));
			post_write(c, strtoull(a[1], NULL, 0), strtoul(a[2], NULL, 0), x,
				   len > sizeof(x) ? sizeof(x) : len, strtoul(a[4], NULL, 0));
		} else if (!strcmp(s, "write_to")) {
			NEED(2);
			struct conn *c = find(a[0]), *o = find(a[1]);
			const char *evil = "EVIL-THROUGH-ANOTHER-QP";
			post_write(c, o->peer_addr, o->peer_rkey, evil, strlen(evil), strlen(evil));
		} else if (!strcmp(s, "tcp_send")) {
			NEED(2);
			struct conn *c = find(a[0]);
			ssize_t n = send(c->tcp, a[1], strlen(a[1]), MSG_NOSIGNAL);
			out("%s tcp-sent %zd", c->name, n);
		} else if (!strcmp(s, "tcp_recv")) {
			NEED(2);
			struct conn *c = find(a[0]);
			struct pollfd p = { .fd = c->tcp, .events = POLLIN };
			char buf[512];
			if (poll(&p, 1, atoi(a[1])) <= 0) {
				out("%s tcp-got nothing", c->name);
			} else {
				ssize_t n = recv(c->tcp, buf, sizeof(buf) - 1, 0);
				if (n < 0)
					out("%s tcp-got error %s", c->name, strerror(errno));
				else {
					buf[n] = 0;
					out("%s tcp-got %zd: %s", c->name, n, buf);
				}
			}
		} else if (!strcmp(s, "recv")) {
			NEED(2);
			pump(atoi(a[1]));
		} else if (!strcmp(s, "disconnect")) {
			NEED(1);
			struct conn *c = find(a[0]);
			rdma_disconnect(c->id);
			out("%s disconnected-by-us", c->name);
		} else if (!strcmp(s, "wait_file")) {
			NEED(2);
			uint64_t end = now_ms() + atoi(a[1]);
			while (access(a[0], F_OK) != 0 && now_ms() < end)
				pump(20);
			out("file %s %s", a[0], access(a[0], F_OK) == 0 ? "there" : "missing");
		} else if (!strcmp(s, "sleep")) {
			NEED(1);
			pump(atoi(a[0]));
		} else if (!strcmp(s, "raw_connect")) {
			NEED(5);
			const char *hex = a[4];
			size_t n = strlen(hex) / 2;
			if (n > sizeof(raw_payload)) {
				out("fatal payload of %zu bytes (at most %zu)", n, sizeof(raw_payload));
				return 2;
			}
			for (size_t k = 0; k < n; k++)
				sscanf(hex + 2 * k, "%2hhx", &raw_payload[k]);
			raw_len = n;
			char *args[5] = { a[0], a[1], a[2], a[3], "0.0.0.0:0" };
			step_connect(args);
		} else if (!strcmp(s, "flood")) {
			NEED(5);
			step_flood(a);
		} else if (!strcmp(s, "listen")) {
			NEED(4);
			step_listen(a);
		} else {
			out("fatal unknown step %s", s);
			return 2;
		}
	}
	out("done");
	return 0;
}
