/*
vla/bootstrap.h: the multi-node bootstrap: node 0 hands a small payload (NCCL's unique id) to
the other nodes over one TCP exchange, after checking that every node runs the same
configuration. Needs config.h and cli.h.
*/
#ifndef VLA_BOOTSTRAP_H
#define VLA_BOOTSTRAP_H

#include "common.h"
#include "config.h"
#include "cli.h"
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

// ----------------------------------------------------------------------------
// multi-node bootstrap: node 0 hands a small payload (NCCL's unique id) to the other nodes over one
// TCP exchange, after checking that every node runs the same configuration

#define BOOT_MAGIC 0x544f4f42u  // "BOOT"
#define BOOT_VERSION 5u  // 2: min_lr_frac and augment joined the fields; 3: SmolVLA's config and train mode;
                         // 4: fp16's --loss-scale and --loss-scale-window (ranks scaled apart sum wrong gradients);
                         // 5: --decay-on (nodes that decay apart drift apart)
#define BOOT_MAX_PAYLOAD 1024

// What every node of a run must agree on; floats go as their bits so they compare exactly
#define BOOT_FIELDS(X) \
    X(gpus_per_node) X(nodes) X(batch) X(accum) X(zero) X(steps) X(warmup) X(start_step) X(seed) X(samples) \
    X(lr_bits) X(min_lr_frac_bits) X(weight_decay_bits) X(clip_bits) X(lr_scale) X(augment) X(train_mode) \
    X(loss_scale_bits) X(loss_scale_window) X(decay_on)

typedef struct {
    uint32_t magic, version;
    int32_t node_rank, pad;
    SmolVLAConfig config;
#define BOOT_FIELD_(f) int64_t f;
    BOOT_FIELDS(BOOT_FIELD_)
#undef BOOT_FIELD_
} BootIdentity;

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
static inline BootIdentity boot_identity(const TrainArgs* a, const SmolVLAConfig* c, int node_rank, int nodes,
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
    const char* cfg = smolvla_config_diff(&a->config, &b->config);
    if (cfg != NULL) { snprintf(msg, size, "model %s", cfg); return 1; }
#define BOOT_DIFF_(f) \
    if (a->f != b->f) { snprintf(msg, size, #f " %lld vs %lld", (long long)a->f, (long long)b->f); return 1; }
    BOOT_FIELDS(BOOT_DIFF_)
#undef BOOT_DIFF_
    return 0;
}

// What node 0 makes of the n bytes a connection sent as its hello. fds[k] >= 0 (k from 1): node
// k has joined. BOOT_HELLO_JOINS: node *rank joins; BOOT_HELLO_REFUSED: a node of this run that
// must not join, why says so in one line; BOOT_HELLO_FOREIGN: not one of ours (a port scanner, an
// older train_vla), to be dropped without an answer.
enum { BOOT_HELLO_FOREIGN = 0, BOOT_HELLO_JOINS = 1, BOOT_HELLO_REFUSED = 2 };
static inline int boot_hello_parse(const BootIdentity* self, const void* msg, size_t n, const int* fds, int* rank,
                                   char* why, size_t why_size) {
    BootIdentity other;
    if (n != sizeof(other)) { return BOOT_HELLO_FOREIGN; }
    memcpy(&other, msg, sizeof(other));
    if (other.magic != BOOT_MAGIC || other.version != BOOT_VERSION) { return BOOT_HELLO_FOREIGN; }
    char diff[192];
    if (other.node_rank < 1 || other.node_rank >= self->nodes || fds[other.node_rank] >= 0) {
        snprintf(why, why_size, "node rank %d is out of range or taken twice (--nodes %lld)", other.node_rank,
                 (long long)self->nodes);
        return BOOT_HELLO_REFUSED;
    }
    if (boot_identity_diff(self, &other, diff, sizeof(diff))) {
        snprintf(why, why_size, "node %d disagrees with node 0 on %s (node 0 vs node %d)", other.node_rank, diff,
                 other.node_rank);
        return BOOT_HELLO_REFUSED;
    }
    *rank = other.node_rank;
    return BOOT_HELLO_JOINS;
}

// What a node makes of node 0's reply header (the n bytes received): BOOT_REPLY_PAYLOAD: the
// payload of payload_bytes follows; BOOT_REPLY_REFUSED: a refusal of *length bytes follows, fewer
// than text_size; BOOT_REPLY_BAD: neither (not node 0 of this run).
enum { BOOT_REPLY_BAD = 0, BOOT_REPLY_PAYLOAD = 1, BOOT_REPLY_REFUSED = 2 };
static inline int boot_reply_parse(const void* msg, size_t n, size_t payload_bytes, size_t text_size, uint32_t* length) {
    BootReply reply;
    if (n != sizeof(reply)) { return BOOT_REPLY_BAD; }
    memcpy(&reply, msg, sizeof(reply));
    *length = reply.length;
    if (reply.status == 0 && reply.length == payload_bytes) { return BOOT_REPLY_PAYLOAD; }
    if (reply.status == 1 && reply.length < text_size) { return BOOT_REPLY_REFUSED; }
    return BOOT_REPLY_BAD;
}

// Node 0's refusal (n bytes, up to a NUL) as one printable line in out: control bytes become '?'
static inline void boot_refusal_text(const void* msg, size_t n, char* out, size_t size) {
    const uint8_t* p = (const uint8_t*)msg;
    size_t k = 0;
    for (; k < n && k + 1 < size && p[k] != 0; k++) { out[k] = p[k] < 0x20 || p[k] == 0x7f ? '?' : (char)p[k]; }
    if (size > 0) { out[k] = '\0'; }
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

// Node 0: listens on the master's port, takes one hello from each of the other nodes within
// timeout_s, checks that they agree with its own identity, and sends them the payload.
// Other nodes: connect to the master (retrying until timeout_s, node 0 may start later), send
// their identity and receive the payload. 0 on success; else 1 and a one-line reason in err.
static inline int bootstrap_exchange(const char* master, const BootIdentity* self, void* payload, size_t payload_bytes,
                                     double timeout_s, char* err, size_t err_size) {
    char host[256], port[16];
    const char* problem = boot_parse_master(master, host, sizeof(host), port, sizeof(port));
    if (problem != NULL) { snprintf(err, err_size, "--master %s: %s", master, problem); return 1; }
    if (payload_bytes > BOOT_MAX_PAYLOAD) { snprintf(err, err_size, "bootstrap payload too large"); return 1; }
    double deadline = wall_seconds() + timeout_s;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int nodes = (int)self->nodes;
    if (self->node_rank == 0) {
        hints.ai_flags = AI_PASSIVE;
        if (getaddrinfo(NULL, port, &hints, &res) != 0 || res == NULL) {
            snprintf(err, err_size, "--master %s: cannot listen on port %s", master, port);
            return 1;
        }
        int lfd = socket(res->ai_family, SOCK_STREAM, 0), one = 1;
        if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, nodes) != 0) {
            int e = errno;
            snprintf(err, err_size, "--master %s: cannot listen on port %s of this machine (%s)%s", master, port,
                     strerror(e), e == EADDRINUSE ? ": the port is in use, pick another" : "");
            if (lfd >= 0) { close(lfd); }
            freeaddrinfo(res);
            return 1;
        }
        freeaddrinfo(res);
        int* fds = (int*)callocCheck(nodes, sizeof(int));
        int joined = 0, failed = 0;
        for (int k = 1; k < nodes; k++) { fds[k] = -1; }
        while (joined < nodes - 1 && !failed) {
            double left = deadline - wall_seconds();
            struct pollfd pfd = {lfd, POLLIN, 0};
            if (left <= 0.0 || poll(&pfd, 1, (int)(left * 1000.0) + 1) <= 0) {
                if (wall_seconds() < deadline) { continue; }
                snprintf(err, err_size, "only %d of the %d other node(s) reached the master %s within %.0f s: start every "
                         "node with --nodes %d and this --master", joined, nodes - 1, master, timeout_s, nodes);
                failed = 1;
                break;
            }
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0) { continue; }
            // each hello gets a few seconds of its own, so a connection that stays silent (a port
            // scanner) cannot hold up the real nodes
            BootIdentity other;
            char why[320];
            int rank = 0, hello = boot_io(fd, &other, sizeof(other), 0, fmin(deadline, wall_seconds() + 5.0)) != 0
                                      ? BOOT_HELLO_FOREIGN
                                      : boot_hello_parse(self, &other, sizeof(other), fds, &rank, why, sizeof(why));
            if (hello == BOOT_HELLO_FOREIGN) {
                close(fd);  // not one of ours, or too slow: keep waiting for the real nodes
                continue;
            }
            if (hello == BOOT_HELLO_JOINS) {
                fds[rank] = fd;
                joined++;
                continue;
            }
            BootReply reply = {1, (uint32_t)strlen(why)};
            boot_io(fd, &reply, sizeof(reply), 1, deadline);
            boot_io(fd, why, reply.length, 1, deadline);
            close(fd);
            snprintf(err, err_size, "%s: start every node with the same flags and data", why);
            failed = 1;
        }
        for (int k = 1; k < nodes; k++) {
            if (fds[k] < 0) { continue; }
            BootReply reply = {(uint32_t)failed, 0};
            const char* refusal = "another node disagrees with node 0: see node 0's error";
            reply.length = failed ? (uint32_t)strlen(refusal) : (uint32_t)payload_bytes;
            boot_io(fds[k], &reply, sizeof(reply), 1, deadline + 5.0);
            boot_io(fds[k], failed ? (void*)refusal : payload, reply.length, 1, deadline + 5.0);
            close(fds[k]);
        }
        free(fds);
        close(lfd);
        return failed;
    }
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) {
        snprintf(err, err_size, "--master %s: cannot resolve host %s: give node 0's name or address", master, host);
        return 1;
    }
    int fd = -1;
    while (fd < 0 && wall_seconds() < deadline) {  // node 0 may not listen yet: retry until the deadline
        for (struct addrinfo* ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            int s = socket(ai->ai_family, SOCK_STREAM, 0);
            if (s < 0) { continue; }
            fcntl(s, F_SETFL, O_NONBLOCK);
            int rc = connect(s, ai->ai_addr, ai->ai_addrlen);
            if (rc != 0 && errno == EINPROGRESS) {
                struct pollfd pfd = {s, POLLOUT, 0};
                int soerr = 1;
                socklen_t len = sizeof(soerr);
                if (poll(&pfd, 1, 1000) > 0 && getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) { rc = 0; }
            }
            if (rc == 0) { fd = s; } else { close(s); }
        }
        if (fd < 0) { usleep(200000); }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_size, "could not reach the master %s within %.0f s: start node 0 with the same --master, and "
                 "check the address, the port and the firewall", master, timeout_s);
        return 1;
    }
    BootReply reply;
    char raw[512] = "", text[512];
    uint32_t length = 0;
    int bad = boot_io(fd, (void*)self, sizeof(*self), 1, deadline) != 0 || boot_io(fd, &reply, sizeof(reply), 0, deadline) != 0;
    int kind = bad ? BOOT_REPLY_BAD : boot_reply_parse(&reply, sizeof(reply), payload_bytes, sizeof(raw), &length);
    if (kind == BOOT_REPLY_PAYLOAD) {
        bad = boot_io(fd, payload, payload_bytes, 0, deadline) != 0;
        close(fd);
        if (!bad) { return 0; }
    } else if (kind == BOOT_REPLY_REFUSED) {
        boot_io(fd, raw, length, 0, deadline);
        close(fd);
        boot_refusal_text(raw, length, text, sizeof(text));
        snprintf(err, err_size, "the master %s refused node %d: %s", master, self->node_rank, text);
        return 1;
    } else {
        close(fd);
    }
    snprintf(err, err_size, "the master %s did not answer node %d within %.0f s: check that node 0 runs the same "
             "train_vla", master, self->node_rank, timeout_s);
    return 1;
}

#endif  // VLA_BOOTSTRAP_H
