/*
vla/bootstrap.h: the multi-node bootstrap: node 0 hands a small payload (NCCL's unique id) to
the other nodes over one TCP exchange, after checking that every node runs the same
configuration and knows the run's token. Needs config.h, cli.h and sha256.h.

One connection per node, three messages:
  node 0 -> node   BootChallenge: magic, version, a nonce node 0 never used before
  node -> node 0   BootHello: the node's identity, a nonce of its own, and the proof
                   HMAC-SHA256(token, "train_vla hello" || challenge nonce || identity || node nonce)
  node 0 -> node   BootReply, then the payload or a refusal, then
                   HMAC-SHA256(token, "train_vla reply" || node nonce || challenge nonce || reply || body)
Without a token the key is empty: the same exchange, which anyone can compute. Node 0 listens
on the address --master names (or --bind's). A connection whose hello is not a proven hello of
a free node rank is a stranger's: node 0 drops it with a warning (at most one per address every
few seconds) and keeps waiting for the real nodes; only a proven hello that disagrees on the
configuration stops the start. The token keeps out whoever does not know it; it encrypts
nothing, and the NCCL traffic that follows is not covered (docs/hardening.md).
*/
#ifndef VLA_BOOTSTRAP_H
#define VLA_BOOTSTRAP_H

#include "common.h"
#include "config.h"
#include "cli.h"
#include "sha256.h"
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <strings.h>

// Whether two digests are equal, in a time that does not depend on where they differ (an
// early exit would tell a guesser how many leading bytes of a proof are right)
static inline int boot_digest_equal(const uint8_t* a, const uint8_t* b) {
    volatile uint8_t d = 0;
    for (int i = 0; i < 32; i++) { d |= (uint8_t)(a[i] ^ b[i]); }
    return d == 0;
}

// ----------------------------------------------------------------------------
// multi-node bootstrap: node 0 hands a small payload (NCCL's unique id) to the other nodes over one
// TCP exchange, after checking that every node runs the same configuration

#define BOOT_MAGIC 0x544f4f42u  // "BOOT"
#define BOOT_VERSION 6u  // 2: min_lr_frac and augment joined the fields; 3: SmolVLA's config and train mode;
                         // 4: fp16's --loss-scale and --loss-scale-window (ranks scaled apart sum wrong gradients);
                         // 5: --decay-on (nodes that decay apart drift apart);
                         // 6: node 0's challenge first, hellos prove the run token, replies prove node 0
#define BOOT_MAX_PAYLOAD 1024
#define BOOT_NONCE 32
#define BOOT_DIGEST 32
#define BOOT_HELLO_SECONDS 5.0  // what a connection gets to say hello: a silent one cannot hold the real nodes up
#define BOOT_MAX_PENDING 64     // connections waiting to say hello at once; past it the oldest is dropped
#define BOOT_WARN_SECONDS 5.0   // one warning per stranger's address this often, at most
#define BOOT_WARN_BURST 8       // and no more than this many per BOOT_WARN_SECONDS over all addresses

// What every node of a run must agree on; floats go as their bits so they compare exactly
#define BOOT_FIELDS(X) \
    X(gpus_per_node) X(nodes) X(batch) X(accum) X(zero) X(steps) X(warmup) X(start_step) X(seed) X(samples) \
    X(lr_bits) X(min_lr_frac_bits) X(weight_decay_bits) X(clip_bits) X(lr_scale) X(augment) X(train_mode) \
    X(loss_scale_bits) X(loss_scale_window) X(decay_on)

typedef struct {
    uint32_t magic, version;
    int32_t node_rank, pad;
    FlowConfig config;
#define BOOT_FIELD_(f) int64_t f;
    BOOT_FIELDS(BOOT_FIELD_)
#undef BOOT_FIELD_
} BootIdentity;

typedef struct {  // node 0 -> node, first on every connection
    uint32_t magic, version;
    uint8_t nonce[BOOT_NONCE];  // fresh per connection: a hello recorded once proves nothing later
} BootChallenge;

typedef struct {  // node -> node 0
    BootIdentity id;
    uint8_t nonce[BOOT_NONCE];   // the node's: node 0's reply proves itself over it
    uint8_t proof[BOOT_DIGEST];  // boot_hello_proof
} BootHello;

typedef struct {
    uint32_t status;  // 0: welcome, the payload follows; 1: refused, a message follows
    uint32_t length;
} BootReply;

static inline int64_t boot_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (int64_t)u;
}

// This node's identity for a run of `gpus_per_node` x `nodes` GPUs starting at `start_step` on
// `samples` samples
static inline BootIdentity boot_identity(const TrainArgs* a, const FlowConfig* c, int node_rank, int nodes,
                                         int start_step, uint64_t samples) {
    BootIdentity id;
    memset(&id, 0, sizeof(id));
    id.magic = BOOT_MAGIC; id.version = BOOT_VERSION; id.node_rank = node_rank; id.config = *c;
    id.gpus_per_node = a->ranks; id.nodes = nodes; id.batch = a->batch; id.accum = a->accum; id.zero = a->zero;
    id.steps = a->steps; id.warmup = a->warmup; id.start_step = start_step; id.seed = (int64_t)a->seed;
    id.samples = (int64_t)samples; id.lr_bits = boot_float_bits(a->lr_base);
    id.min_lr_frac_bits = boot_float_bits(a->min_lr_frac); id.weight_decay_bits = boot_float_bits(a->weight_decay);
    id.clip_bits = boot_float_bits(a->grad_clip); id.decay_on = a->decay_on;
    id.lr_scale = a->lr_scale; id.augment = a->augment;
    id.train_mode = a->train_mode;
    id.loss_scale_bits = boot_float_bits(a->loss_scale); id.loss_scale_window = a->loss_scale_window;
    return id;
}

// Names the first field where two identities differ (into msg), or returns 0 when they agree
static inline int boot_identity_diff(const BootIdentity* a, const BootIdentity* b, char* msg, size_t size) {
    const char* cfg = flow_config_diff(&a->config, &b->config);
    if (cfg != NULL) { snprintf(msg, size, "model %s", cfg); return 1; }
#define BOOT_DIFF_(f) \
    if (a->f != b->f) { snprintf(msg, size, #f " %lld vs %lld", (long long)a->f, (long long)b->f); return 1; }
    BOOT_FIELDS(BOOT_DIFF_)
#undef BOOT_DIFF_
    return 0;
}

// The key of the proofs: the token, or nothing (NULL or "") for a run without one
static inline void boot_mac_init(HmacSha256* m, const char* token, const char* label) {
    hmac_sha256_init(m, token, token != NULL ? strlen(token) : 0);
    hmac_sha256_update(m, label, strlen(label));
}

// The proof a hello carries, over node 0's challenge nonce and the rest of the hello
static inline void boot_hello_proof(const char* token, const uint8_t* challenge, const BootHello* h, uint8_t out[32]) {
    HmacSha256 m;
    boot_mac_init(&m, token, "train_vla hello");
    hmac_sha256_update(&m, challenge, BOOT_NONCE);
    hmac_sha256_update(&m, &h->id, sizeof(h->id));
    hmac_sha256_update(&m, h->nonce, BOOT_NONCE);
    hmac_sha256_final(&m, out);
}

// The proof that follows node 0's reply and its body (reply->length bytes), over the node's nonce
// and the challenge: a node takes its payload only from the node 0 that knows the token
static inline void boot_reply_proof(const char* token, const uint8_t* node_nonce, const uint8_t* challenge,
                                    const BootReply* reply, const void* body, uint8_t out[32]) {
    HmacSha256 m;
    boot_mac_init(&m, token, "train_vla reply");
    hmac_sha256_update(&m, node_nonce, BOOT_NONCE);
    hmac_sha256_update(&m, challenge, BOOT_NONCE);
    hmac_sha256_update(&m, reply, sizeof(*reply));
    hmac_sha256_update(&m, body, reply->length);
    hmac_sha256_final(&m, out);
}

// What node 0 makes of the n bytes a connection sent after its challenge (nonce `challenge`),
// with `token` (NULL: none). fds[k] >= 0 (k from 1): node k has joined. BOOT_HELLO_JOINS: node
// *rank joins; BOOT_HELLO_REFUSED: a node of this run, proven by the token (or in a run without
// one), that must not join: it disagrees on the configuration, why says so in one line;
// BOOT_HELLO_STRANGER: not a node of this run (a port scanner, another run, an older train_vla, a
// node with another token, a node rank in use), why says what is wrong in one line: dropped
// without an answer. Nothing a hello says is believed before its proof is checked.
enum { BOOT_HELLO_STRANGER = 0, BOOT_HELLO_JOINS = 1, BOOT_HELLO_REFUSED = 2 };
static inline int boot_hello_parse(const BootIdentity* self, const char* token, const uint8_t* challenge,
                                   const void* msg, size_t n, const int* fds, int* rank, char* why, size_t why_size) {
    BootHello h;
    uint32_t head[2];
    if (n >= sizeof(head)) {  // (the header alone tells an older train_vla or a stranger from a short hello)
        memcpy(head, msg, sizeof(head));
        if (head[0] != BOOT_MAGIC) {
            snprintf(why, why_size, "not a train_vla hello: it begins 0x%08x", head[0]);
            return BOOT_HELLO_STRANGER;
        }
        if (head[1] != BOOT_VERSION) {
            snprintf(why, why_size,
                     "a hello of bootstrap version %u, this train_vla's is %u: run the same train_vla on "
                     "every node",
                     head[1], BOOT_VERSION);
            return BOOT_HELLO_STRANGER;
        }
    }
    if (n != sizeof(h)) {
        snprintf(why, why_size, "%zu bytes, not a hello of %zu", n, sizeof(h));
        return BOOT_HELLO_STRANGER;
    }
    memcpy(&h, msg, sizeof(h));
    uint8_t proof[BOOT_DIGEST];
    boot_hello_proof(token, challenge, &h, proof);
    if (!boot_digest_equal(proof, h.proof)) {
        snprintf(
            why, why_size, "%s",
            token != NULL && token[0] != '\0'
                ? "its hello does not prove this run's token: another --run-token, or none"
                : "its hello is not one of a run without a token: a node given a --run-token node 0 lacks, or no node");
        return BOOT_HELLO_STRANGER;
    }
    char diff[192];
    if (boot_identity_diff(self, &h.id, diff, sizeof(diff))) {
        snprintf(why, why_size, "node %d disagrees with node 0 on %s (node 0 vs node %d)", h.id.node_rank, diff,
                 h.id.node_rank);
        return BOOT_HELLO_REFUSED;
    }
    if (h.id.node_rank < 1 || h.id.node_rank >= self->nodes) {
        snprintf(why, why_size, "node rank %d out of range 1..%lld", h.id.node_rank, (long long)self->nodes - 1);
        return BOOT_HELLO_STRANGER;
    }
    if (fds[h.id.node_rank] >= 0) {
        snprintf(why, why_size, "node rank %d has joined already: give every node a --node-rank of its own",
                 h.id.node_rank);
        return BOOT_HELLO_STRANGER;
    }
    *rank = h.id.node_rank;
    return BOOT_HELLO_JOINS;
}

// What a node makes of node 0's reply header (the n bytes received): BOOT_REPLY_PAYLOAD: the
// payload of payload_bytes follows; BOOT_REPLY_REFUSED: a refusal of *length bytes follows, fewer
// than text_size; BOOT_REPLY_BAD: neither (not node 0 of this run). The body's proof follows
// either (boot_reply_proof).
enum { BOOT_REPLY_BAD = 0, BOOT_REPLY_PAYLOAD = 1, BOOT_REPLY_REFUSED = 2 };
static inline int boot_reply_parse(const void* msg, size_t n, size_t payload_bytes, size_t text_size,
                                   uint32_t* length) {
    BootReply reply;
    if (n != sizeof(reply)) { return BOOT_REPLY_BAD; }
    memcpy(&reply, msg, sizeof(reply));
    *length = reply.length;
    if (reply.status == 0 && reply.length == payload_bytes) { return BOOT_REPLY_PAYLOAD; }
    if (reply.status == 1 && reply.length < text_size) { return BOOT_REPLY_REFUSED; }
    return BOOT_REPLY_BAD;
}

// Node 0's refusal (n bytes, up to a NUL) as one printable line in out: control bytes, DEL and
// bytes past ASCII (a terminal reads some as commands) become \xNN; a backslash becomes \\.
static inline void boot_refusal_text(const void* msg, size_t n, char* out, size_t size) {
    const uint8_t* p = (const uint8_t*)msg;
    size_t o = 0;
    if (size == 0) { return; }
    for (size_t k = 0; k < n && p[k] != 0; k++) {
        char esc[8];
        int plain = p[k] >= 0x20 && p[k] < 0x7f && p[k] != '\\';
        int w = plain          ? 1
                : p[k] == '\\' ? snprintf(esc, sizeof(esc), "\\\\")
                               : snprintf(esc, sizeof(esc), "\\x%02x", p[k]);
        if (o + (size_t)w + 1 > size) { break; }
        if (plain) { out[o] = (char)p[k]; } else { memcpy(out + o, esc, (size_t)w); }
        o += (size_t)w;
    }
    out[o] = '\0';
}

// All of buf over fd, before the deadline (wall_seconds); 0 on success
static inline int boot_io(int fd, void* buf, size_t n, int sending, double deadline) {
    uint8_t* p = (uint8_t*)buf;
    while (n > 0) {
        double left = deadline - wall_seconds();
        if (left <= 0.0) { return 1; }
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        if (poll(&pfd, 1, (int)(left * 1000.0) + 1) <= 0) { continue; }
        ssize_t r = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r <= 0) {
            if (r < 0 && (errno == EINTR || errno == EAGAIN)) { continue; }
            return 1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

// n bytes from the system's random source; 0 on success
static inline int boot_random(void* buf, size_t n) {
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0) { return 1; }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (uint8_t*)buf + got, n - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) { continue; }
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    return got != n;
}

// A socket address as text, "1.2.3.4:5" or "[::1]:5", and its host part alone in host (when not NULL)
static inline void boot_addr_text(const struct sockaddr* sa, socklen_t len, char* out, size_t size, char* host,
                                  size_t host_size) {
    char h[NI_MAXHOST], s[NI_MAXSERV];
    if (getnameinfo(sa, len, h, sizeof(h), s, sizeof(s), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(h, sizeof(h), "?");
        snprintf(s, sizeof(s), "?");
    }
    snprintf(out, size, strchr(h, ':') != NULL ? "[%s]:%s" : "%s:%s", h, s);
    if (host != NULL) { snprintf(host, host_size, "%s", h); }
}

static inline int boot_is_loopback(const struct sockaddr* sa) {
    if (sa->sa_family == AF_INET) { return (ntohl(((const struct sockaddr_in*)sa)->sin_addr.s_addr) >> 24) == 127; }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr* a = &((const struct sockaddr_in6*)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

// Whether host is this machine's own name (short or with its domain)
static inline int boot_is_own_name(const char* host) {
    char me[256];
    if (gethostname(me, sizeof(me)) != 0) { return 0; }
    me[sizeof(me) - 1] = '\0';
    size_t a = strlen(host), b = strlen(me), n = a < b ? a : b;
    return n > 0 && strncasecmp(host, me, n) == 0 && (a == b || (a > b ? host[n] : me[n]) == '.');
}

// Node 0's listening socket on --master's port, at the address --bind names (bind_addr), else at
// the one --master names: a name of this machine or one of its addresses, so that a --master of
// 127.0.0.1 listens on loopback alone. A name that maps to the network and to loopback listens on
// the network; this machine's own name mapped to loopback alone (the hosts file of some
// distributions: 127.0.1.1) listens on every address with a warning, the other nodes could not
// reach it otherwise. Returns the socket, its address as text in `where`; or -1 and a one-line
// reason in err.
static inline int boot_listen(const char* master, const char* bind_addr, char* where, size_t where_size, char* err,
                              size_t err_size) {
    char host[256], port[16];
    const char* problem = boot_parse_master(master, host, sizeof(host), port, sizeof(port));
    if (problem != NULL) { snprintf(err, err_size, "--master %s: %s", master, problem); return -1; }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const char* want = bind_addr != NULL ? bind_addr : host;
    int rc = getaddrinfo(want, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        if (bind_addr != NULL) {
            snprintf(err, err_size,
                     "--bind %s: not an address (%s): give an address of this machine alone (the port is "
                     "--master's), or 0.0.0.0 to listen on all of them",
                     bind_addr, gai_strerror(rc));
        } else {
            snprintf(err, err_size,
                     "--master %s: cannot resolve %s on node 0 (%s): give node 0's own name or address, or "
                     "the address to listen on with --bind",
                     master, host, gai_strerror(rc));
        }
        return -1;
    }
    int network = 0;
    for (struct addrinfo* ai = res; ai != NULL; ai = ai->ai_next) { network |= !boot_is_loopback(ai->ai_addr); }
    if (bind_addr == NULL && !network && boot_is_own_name(host)) {
        char seen[80];
        boot_addr_text(res->ai_addr, res->ai_addrlen, seen, sizeof(seen), NULL, 0);
        fprintf(stderr, "warning: --master %s: this machine maps its own name to loopback alone (%s, its hosts file), "
                "which the other nodes cannot reach: node 0 listens on every address; --bind ADDR picks one\n",
                master, seen);
        fflush(stderr);
        freeaddrinfo(res);
        res = NULL;
        if (getaddrinfo(NULL, port, &hints, &res) != 0 || res == NULL) {
            snprintf(err, err_size, "--master %s: cannot listen on port %s", master, port);
            return -1;
        }
    }
    int lfd = -1, e = EADDRNOTAVAIL;
    char tried[80] = "";
    for (struct addrinfo* ai = res; ai != NULL && lfd < 0; ai = ai->ai_next) {
        if (network && boot_is_loopback(ai->ai_addr)) { continue; }
        boot_addr_text(ai->ai_addr, ai->ai_addrlen, tried, sizeof(tried), NULL, 0);
        int s = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
        if (s >= 0 && setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 128) == 0) {
            lfd = s;
            break;
        }
        e = errno;
        if (s >= 0) { close(s); }
    }
    freeaddrinfo(res);
    if (lfd < 0) {
        char what[320];
        snprintf(what, sizeof(what), "%s %s", bind_addr != NULL ? "--bind" : "--master",
                 bind_addr != NULL ? bind_addr : master);
        if (e == EADDRINUSE) {
            snprintf(err, err_size, "%s: cannot listen on %s (%s): the port is in use, pick another", what, tried,
                     strerror(e));
        } else if (bind_addr != NULL) {
            snprintf(err, err_size,
                     "%s: node 0 cannot listen on %s (%s): give an address of this machine, or 0.0.0.0 to "
                     "listen on all of them",
                     what, tried, strerror(e));
        } else {
            snprintf(err, err_size,
                     "%s: node 0 cannot listen on %s (%s): give node 0's own address in --master, or the "
                     "address to listen on with --bind",
                     what, host, strerror(e));
        }
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    getsockname(lfd, (struct sockaddr*)&sa, &len);
    boot_addr_text((struct sockaddr*)&sa, len, where, where_size, NULL, 0);
    fcntl(lfd, F_SETFL,
          O_NONBLOCK);  // (node 0 accepts when poll says so, and a connection gone by then must not block it)
    return lfd;
}

// Node 0's warnings about strangers, rate-limited: one per address every BOOT_WARN_SECONDS, and
// no more than BOOT_WARN_BURST in that time over all addresses; the rest are counted
typedef struct {
    struct { char host[64]; double last; int quiet; } peers[16];
    int n_peers;
    double burst_start;
    int burst, quiet;  // warnings in the burst window; strangers dropped without one
} BootWarnings;

// Whether a stranger from `host` is to be named now; *quiet_before gets how many from it went
// unnamed since its last warning
static inline int boot_warn_due(BootWarnings* w, const char* host, double now, int* quiet_before) {
    int k = 0, oldest = 0;
    for (; k < w->n_peers && strcmp(w->peers[k].host, host) != 0; k++) {
        if (w->peers[k].last < w->peers[oldest].last) { oldest = k; }
    }
    if (k == w->n_peers) {  // a new address: a free slot, else the one warned about longest ago
        k = w->n_peers < 16 ? w->n_peers++ : oldest;
        snprintf(w->peers[k].host, sizeof(w->peers[k].host), "%s", host);
        w->peers[k].last = -1e30;
        w->peers[k].quiet = 0;
    }
    if (now - w->burst_start >= BOOT_WARN_SECONDS) { w->burst_start = now; w->burst = 0; }
    if (now - w->peers[k].last < BOOT_WARN_SECONDS || w->burst >= BOOT_WARN_BURST) {
        w->peers[k].quiet++;
        w->quiet++;
        return 0;
    }
    *quiet_before = w->peers[k].quiet;
    w->quiet -= w->peers[k].quiet;
    w->peers[k].quiet = 0;
    w->peers[k].last = now;
    w->burst++;
    return 1;
}

typedef struct {
    int fd;
    double deadline;                 // to have said hello by
    size_t got;                      // bytes of the hello so far
    char peer[80];                   // its address and port, as text
    char host[64];                   // its address
    uint8_t challenge[BOOT_NONCE];
    BootHello hello;
} BootPending;

static inline void boot_drop_stranger(BootWarnings* w, BootPending* p, const char* why, double now) {
    int quiet = 0;
    if (boot_warn_due(w, p->host, now, &quiet)) {
        char more[96] = "";
        if (quiet > 0) {
            snprintf(more, sizeof(more), " (%d more from %s unnamed since the last warning)", quiet, p->host);
        }
        fprintf(stderr,
                "warning: bootstrap: dropped a connection from %s that is not a node of this run (%s): waiting for "
                "the real nodes%s\n",
                p->peer, why, more);
        fflush(stderr);
    }
    close(p->fd);
    p->fd = -1;
}

// Node 0's reply to one node (its hello and challenge in p): header, body, proof
static inline void boot_send_reply(const char* token, const BootPending* p, uint32_t status, const void* body,
                                   uint32_t length, double deadline) {
    BootReply reply = {status, length};
    uint8_t proof[BOOT_DIGEST];
    boot_reply_proof(token, p->hello.nonce, p->challenge, &reply, body, proof);
    if (boot_io(p->fd, &reply, sizeof(reply), 1, deadline) == 0 &&
        boot_io(p->fd, (void*)body, length, 1, deadline) == 0) {
        boot_io(p->fd, proof, sizeof(proof), 1, deadline);
    }
}

// Node 0's side: takes one proven hello from each of the other nodes on lfd within the deadline,
// dropping strangers, and sends them the payload (or the refusal, when one disagrees)
static inline int boot_serve(int lfd, const char* master, const char* token, const BootIdentity* self, void* payload,
                             size_t payload_bytes, double timeout_s, double deadline, char* err, size_t err_size) {
    int nodes = (int)self->nodes;
    uint8_t secret[BOOT_NONCE];
    if (boot_random(secret, sizeof(secret)) != 0) {
        snprintf(err, err_size, "cannot read /dev/urandom (%s): the bootstrap's challenges need it", strerror(errno));
        return 1;
    }
    uint64_t challenges = 0;
    int* fds = (int*)callocCheck(nodes, sizeof(int));
    BootPending* member = (BootPending*)callocCheck(nodes, sizeof(BootPending));
    BootPending* pending = (BootPending*)callocCheck(BOOT_MAX_PENDING, sizeof(BootPending));
    struct pollfd pfds[1 + BOOT_MAX_PENDING];
    BootWarnings warnings;
    memset(&warnings, 0, sizeof(warnings));
    warnings.burst_start = -1e30;
    int n_pending = 0, joined = 0, failed = 0;
    for (int k = 0; k < nodes; k++) { fds[k] = -1; }
    while (joined < nodes - 1 && !failed) {
        double now = wall_seconds();
        if (now >= deadline) {
            snprintf(err, err_size,
                     "only %d of the %d other node(s) reached the master %s within %.0f s: start every "
                     "node with --nodes %d, this --master and the same --run-token",
                     joined, nodes - 1, master, timeout_s, nodes);
            failed = 1;
            break;
        }
        double wake = deadline;
        for (int i = 0; i < n_pending; i++) {
            if (pending[i].deadline <= now) {
                char why[96];
                snprintf(why, sizeof(why), "%zu of a hello's %zu bytes in %.0f s", pending[i].got, sizeof(BootHello),
                         BOOT_HELLO_SECONDS);
                boot_drop_stranger(&warnings, &pending[i], why, now);
            } else if (pending[i].deadline < wake) {
                wake = pending[i].deadline;
            }
        }
        int kept = 0;  // (pending in the order they came: the first is the oldest)
        for (int i = 0; i < n_pending; i++) {
            if (pending[i].fd >= 0) { pending[kept++] = pending[i]; }
        }
        n_pending = kept;
        pfds[0].fd = lfd;
        pfds[0].events = POLLIN;
        for (int i = 0; i < n_pending; i++) { pfds[1 + i].fd = pending[i].fd; pfds[1 + i].events = POLLIN; }
        for (int i = 0; i <= n_pending; i++) { pfds[i].revents = 0; }
        if (poll(pfds, (nfds_t)(1 + n_pending), (int)((wake - now) * 1000.0) + 1) <= 0) { continue; }
        now = wall_seconds();
        for (int i = 0; i < n_pending && !failed; i++) {
            BootPending* p = &pending[i];
            if (pfds[1 + i].revents == 0) { continue; }
            ssize_t r = recv(p->fd, (uint8_t*)&p->hello + p->got, sizeof(p->hello) - p->got, MSG_DONTWAIT);
            if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) { continue; }
            if (r > 0) { p->got += (size_t)r; }
            // part of a hello, its header right or not yet whole: the rest is still to come (a wrong
            // header is dropped at once; a connection gone before a whole hello, r <= 0, too)
            int head = p->got >= 2 * sizeof(uint32_t), head_ok = p->hello.id.magic == BOOT_MAGIC &&
                                                                   p->hello.id.version == BOOT_VERSION;
            if (r > 0 && p->got < sizeof(p->hello) && (!head || head_ok)) { continue; }
            char why[320];
            int rank = 0;
            int hello = boot_hello_parse(self, token, p->challenge, &p->hello, p->got, fds, &rank, why, sizeof(why));
            if (hello == BOOT_HELLO_STRANGER) {
                boot_drop_stranger(&warnings, p, why, now);
            } else if (hello == BOOT_HELLO_JOINS) {
                member[rank] = *p;
                fds[rank] = p->fd;
                p->fd = -1;
                joined++;
            } else {
                boot_send_reply(token, p, 1, why, (uint32_t)strlen(why), fmin(deadline, now + BOOT_HELLO_SECONDS));
                close(p->fd);
                p->fd = -1;
                snprintf(err, err_size, "%s: start every node with the same flags and data", why);
                failed = 1;
            }
        }
        kept = 0;
        for (int i = 0; i < n_pending; i++) {
            if (pending[i].fd >= 0) { pending[kept++] = pending[i]; }
        }
        n_pending = kept;
        for (int burst = 0; burst < BOOT_MAX_PENDING && !failed && (pfds[0].revents & POLLIN); burst++) {
            struct sockaddr_storage sa;
            socklen_t len = sizeof(sa);
            int fd = accept(lfd, (struct sockaddr*)&sa, &len);
            if (fd < 0) { break; }  // (none left: EAGAIN)
            if (n_pending == BOOT_MAX_PENDING) {  // a flood: the oldest goes, the newest gets its chance
                char why[96];
                snprintf(why, sizeof(why), "still no hello when %d more connections waited", BOOT_MAX_PENDING);
                boot_drop_stranger(&warnings, &pending[0], why, now);
                memmove(pending, pending + 1, (BOOT_MAX_PENDING - 1) * sizeof(BootPending));
                n_pending--;
            }
            BootPending* p = &pending[n_pending];
            memset(p, 0, sizeof(*p));
            p->fd = fd;
            p->deadline = fmin(deadline, now + BOOT_HELLO_SECONDS);
            boot_addr_text((struct sockaddr*)&sa, len, p->peer, sizeof(p->peer), p->host, sizeof(p->host));
            // each challenge: SHA-256 of this run's secret and a counter, never the same twice
            uint8_t seed[BOOT_NONCE + 8], digest[32];
            memcpy(seed, secret, BOOT_NONCE);
            memcpy(seed + BOOT_NONCE, &challenges, 8);
            challenges++;
            sha256(seed, sizeof(seed), digest);
            memcpy(p->challenge, digest, BOOT_NONCE);
            BootChallenge c;
            c.magic = BOOT_MAGIC;
            c.version = BOOT_VERSION;
            memcpy(c.nonce, p->challenge, BOOT_NONCE);
            // 40 bytes into a fresh socket's empty buffer: one send, which cannot block
            if (send(fd, &c, sizeof(c), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(c)) { close(fd); continue; }
            n_pending++;
        }
    }
    for (int i = 0; i < n_pending; i++) { close(pending[i].fd); }
    if (warnings.quiet > 0) {
        fprintf(stderr,
                "warning: bootstrap: dropped %d more connection(s) that were not nodes of this run, not each named "
                "(one warning per address every %.0f s)\n",
                warnings.quiet, BOOT_WARN_SECONDS);
        fflush(stderr);
    }
    const char* refusal = "node 0 stopped the start: see node 0's error";
    for (int k = 1; k < nodes; k++) {
        if (fds[k] < 0) { continue; }
        boot_send_reply(token, &member[k], (uint32_t)failed, failed ? (const void*)refusal : payload,
                        failed ? (uint32_t)strlen(refusal) : (uint32_t)payload_bytes, deadline + 5.0);
        close(fds[k]);
    }
    free(pending);
    free(member);
    free(fds);
    return failed;
}

// Node 0: listens on the address --master names (or bind_addr), takes one proven hello from each
// of the other nodes within timeout_s, checks that they agree with its own identity, and sends
// them the payload. Other nodes: connect to the master (retrying until timeout_s: node 0 may start
// later, or drop them under a flood), answer its challenge with their identity and proof, and
// receive the payload. token: the run's (NULL: none, and node 0 warns). 0 on success; else 1 and
// a one-line reason in err.
static inline int bootstrap_exchange(const char* master, const char* bind_addr, const char* token,
                                     const BootIdentity* self, void* payload, size_t payload_bytes, double timeout_s,
                                     char* err, size_t err_size) {
    char host[256], port[16];
    const char* problem = boot_parse_master(master, host, sizeof(host), port, sizeof(port));
    if (problem != NULL) { snprintf(err, err_size, "--master %s: %s", master, problem); return 1; }
    if (payload_bytes > BOOT_MAX_PAYLOAD) { snprintf(err, err_size, "bootstrap payload too large"); return 1; }
    if (token != NULL && token[0] == '\0') { token = NULL; }
    double deadline = wall_seconds() + timeout_s;
    if (self->node_rank == 0) {
        char where[300];
        int lfd = boot_listen(master, bind_addr, where, sizeof(where), err, err_size);
        if (lfd < 0) { return 1; }
        if (token == NULL) {
            fprintf(stderr,
                    "warning: the multi-node bootstrap has no run token: any host that reaches %s can join this "
                    "run; pass the same --run-token (or VLA_RUN_TOKEN) to every node\n",
                    where);
            fflush(stderr);
        }
        int failed = boot_serve(lfd, master, token, self, payload, payload_bytes, timeout_s, deadline, err, err_size);
        close(lfd);
        return failed;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) {
        snprintf(err, err_size, "--master %s: cannot resolve host %s: give node 0's name or address", master, host);
        return 1;
    }
    uint8_t body[BOOT_MAX_PAYLOAD > 512 ? BOOT_MAX_PAYLOAD : 512];
    int reached = 0, dropped = 0, late = 0;
    while (wall_seconds() < deadline) {
        int fd = -1;
        for (struct addrinfo* ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            int s = socket(ai->ai_family, SOCK_STREAM, 0);
            if (s < 0) { continue; }
            fcntl(s, F_SETFL, O_NONBLOCK);
            int rc = connect(s, ai->ai_addr, ai->ai_addrlen);
            if (rc != 0 && errno == EINPROGRESS) {
                struct pollfd pfd = {s, POLLOUT, 0};
                int soerr = 1;
                socklen_t len = sizeof(soerr);
                if (poll(&pfd, 1, 1000) > 0 && getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) {
                    rc = 0;
                }
            }
            if (rc == 0) { fd = s; } else { close(s); }
        }
        if (fd < 0) { usleep(200000); continue; }  // node 0 may not listen yet: retry until the deadline
        reached = 1;
        BootChallenge c;
        if (boot_io(fd, &c, sizeof(c), 0, deadline) != 0) {  // closed before its challenge: dropped, or not ours
            close(fd);
            usleep(200000);
            continue;
        }
        if (c.magic != BOOT_MAGIC || c.version != BOOT_VERSION) {
            close(fd);
            freeaddrinfo(res);
            if (c.magic != BOOT_MAGIC) {
                snprintf(err, err_size, "the master %s is not a train_vla bootstrap: check --master's address and port",
                         master);
            } else {
                snprintf(err, err_size,
                         "the master %s speaks bootstrap version %u, node %d's train_vla %u: run the same "
                         "train_vla on every node",
                         master, c.version, self->node_rank, BOOT_VERSION);
            }
            return 1;
        }
        BootHello h;
        memset(&h, 0, sizeof(h));
        h.id = *self;
        if (boot_random(h.nonce, sizeof(h.nonce)) != 0) {
            close(fd);
            freeaddrinfo(res);
            snprintf(err, err_size, "cannot read /dev/urandom (%s): the bootstrap's nonces need it", strerror(errno));
            return 1;
        }
        boot_hello_proof(token, c.nonce, &h, h.proof);
        BootReply reply;
        if (boot_io(fd, &h, sizeof(h), 1, deadline) != 0 || boot_io(fd, &reply, sizeof(reply), 0, deadline) != 0) {
            close(fd);
            if (wall_seconds() >= deadline) { late = 1; break; }  // node 0 took the hello, the others came too late
            dropped++;  // node 0 dropped the hello (another token, a rank in use): it may be a flood's doing, retry
            double pause = fmin(0.9, deadline - wall_seconds());
            if (pause > 0.0) { usleep((useconds_t)(pause * 1e6)); }
            continue;
        }
        uint32_t length = 0;
        uint8_t proof[BOOT_DIGEST], want[BOOT_DIGEST];
        int kind = boot_reply_parse(&reply, sizeof(reply), payload_bytes, 512, &length);
        int bad = kind == BOOT_REPLY_BAD || boot_io(fd, body, length, 0, deadline) != 0 ||
                  boot_io(fd, proof, sizeof(proof), 0, deadline) != 0;
        close(fd);
        freeaddrinfo(res);
        if (bad) {
            snprintf(err, err_size,
                     "the master %s did not answer node %d as train_vla's node 0 within %.0f s: check that "
                     "node 0 runs the same train_vla",
                     master, self->node_rank, timeout_s);
            return 1;
        }
        boot_reply_proof(token, h.nonce, c.nonce, &reply, body, want);
        if (!boot_digest_equal(proof, want)) {
            snprintf(err, err_size,
                     "the master %s answered node %d without this run's token: check that every node got "
                     "the same --run-token (or VLA_RUN_TOKEN) and that --master names node 0",
                     master, self->node_rank);
            return 1;
        }
        if (kind == BOOT_REPLY_REFUSED) {
            char text[512 * 4];
            boot_refusal_text(body, length, text, sizeof(text));
            snprintf(err, err_size, "the master %s refused node %d: %s", master, self->node_rank, text);
            return 1;
        }
        memcpy(payload, body, payload_bytes);
        return 0;
    }
    freeaddrinfo(res);
    if (late) {
        snprintf(err, err_size, "the master %s took node %d's hello but did not answer within %.0f s: start every node "
                 "within --bootstrap-timeout of node 0, with the same --nodes", master, self->node_rank, timeout_s);
    } else if (dropped > 0) {
        snprintf(err, err_size,
                 "node 0 at %s dropped node %d's hello %d time(s) within %.0f s: check that every node got "
                 "the same --run-token (or VLA_RUN_TOKEN), a --node-rank of its own and the same train_vla",
                 master, self->node_rank, dropped, timeout_s);
    } else if (reached) {
        snprintf(err, err_size,
                 "the master %s did not challenge node %d within %.0f s: check that node 0 runs the same "
                 "train_vla",
                 master, self->node_rank, timeout_s);
    } else {
        snprintf(err, err_size, "could not reach the master %s within %.0f s: start node 0 with the same --master, and "
                 "check the address, the port and the firewall", master, timeout_s);
    }
    return 1;
}

#endif  // VLA_BOOTSTRAP_H
