// fuzz_boot.c: the multi-node bootstrap's reading of what arrives over its sockets, on arbitrary
// bytes, without sockets. Each input is a flags byte, a token (its length in one byte, then its
// bytes; length 0: a run without one), node 0's challenge nonce (32 bytes), and then:
// bit 0 clear: the bytes a connection sent, which node 0 (of a 4-node run of the tiny preset;
// bits 1-3: nodes 1-3 have joined) reads as a hello (boot_hello_parse): a node joins only with
// a hello of the exact size whose proof checks under the token, an identity equal to node 0's
// but for its rank, a rank not taken and in range; a refusal only with a proof that checks and
// an identity that differs; anything else is a stranger's, and every reason is one line.
// Bit 0 set: the node's nonce (32 bytes), then what a node reads as node 0's reply header, its
// body and its proof (boot_reply_parse, boot_reply_proof, boot_refusal_text): a refusal becomes
// one printable line.
#include "fuzz_util.h"
#include "../../vla/bootstrap.h"

static void fuzz_one_line(const char* s) {
    if (s[0] == '\0') { abort(); }
    for (const char* p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) { abort(); }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static BootIdentity self;
    if (self.magic == 0) { self = fuzz_boot_identity(0); }
    if (size < 2 || size < 2 + (size_t)data[1] + BOOT_NONCE) { return 0; }
    char token[256];
    memcpy(token, data + 2, data[1]);
    token[data[1]] = '\0';
    const char* key = data[1] > 0 ? token : NULL;  // (a token with a NUL inside is its first part, as a C string is)
    const uint8_t* challenge = data + 2 + data[1];
    const uint8_t* msg = challenge + BOOT_NONCE;
    size_t n = size - (size_t)(msg - data);
    if ((data[0] & 1) == 0) {
        int fds[4] = {0, -1, -1, -1};
        for (int k = 1; k < 4; k++) { fds[k] = data[0] & (1 << k) ? 10 + k : -1; }
        int rank = -1;
        char why[320];
        why[0] = '\0';
        int hello = boot_hello_parse(&self, key, challenge, msg, n, fds, &rank, why, sizeof(why));
        if (hello == BOOT_HELLO_JOINS || hello == BOOT_HELLO_REFUSED) {
            BootHello h;
            if (n != sizeof(h)) { abort(); }  // (only a whole hello is believed)
            memcpy(&h, msg, sizeof(h));
            uint8_t proof[BOOT_DIGEST];
            boot_hello_proof(key, challenge, &h, proof);
            if (memcmp(proof, h.proof, sizeof(proof)) != 0) { abort(); }  // nothing unproven joins or refuses
            char diff[192];
            int differs = boot_identity_diff(&self, &h.id, diff, sizeof(diff));
            if (hello == BOOT_HELLO_JOINS && (differs || rank != h.id.node_rank || rank < 1 || rank > 3 || fds[rank] >= 0)) {
                abort();
            }
            if (hello == BOOT_HELLO_REFUSED) {
                if (!differs) { abort(); }
                fuzz_one_line(why);
            }
        } else if (hello == BOOT_HELLO_STRANGER) {
            fuzz_one_line(why);
        } else {
            abort();
        }
        return 0;
    }
    if (n < BOOT_NONCE) { return 0; }
    const uint8_t* node_nonce = msg;
    msg += BOOT_NONCE;
    n -= BOOT_NONCE;
    uint32_t length = 0;
    size_t header = n < sizeof(BootReply) ? n : sizeof(BootReply);
    int kind = boot_reply_parse(msg, header, FUZZ_BOOT_PAYLOAD, 512, &length);
    if (kind == BOOT_REPLY_PAYLOAD && (header != sizeof(BootReply) || length != FUZZ_BOOT_PAYLOAD)) { abort(); }
    if (kind == BOOT_REPLY_BAD) { return 0; }
    if (length >= 512 && kind == BOOT_REPLY_REFUSED) { abort(); }
    // the body: what followed the header, as many bytes as it announced (the rest zero, as a short
    // read leaves the buffer), then its proof
    uint8_t body[FUZZ_BOOT_PAYLOAD > 512 ? FUZZ_BOOT_PAYLOAD : 512], proof[BOOT_DIGEST], want[BOOT_DIGEST];
    memset(body, 0, sizeof(body));
    memset(proof, 0, sizeof(proof));
    size_t got = n - header < length ? n - header : length;
    memcpy(body, msg + header, got);
    size_t after = n - header - got;
    memcpy(proof, msg + header + got, after < BOOT_DIGEST ? after : BOOT_DIGEST);
    BootReply reply;
    memcpy(&reply, msg, sizeof(reply));
    boot_reply_proof(key, node_nonce, challenge, &reply, body, want);
    int proven = boot_digest_equal(proof, want);
    if (proven != (memcmp(proof, want, sizeof(want)) == 0)) { abort(); }
    if (kind == BOOT_REPLY_REFUSED) {
        char text[512 * 4];
        boot_refusal_text(body, length, text, sizeof(text));
        for (const char* p = text; *p; p++) {
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) { abort(); }  // one printable line
        }
    }
    return 0;
}
