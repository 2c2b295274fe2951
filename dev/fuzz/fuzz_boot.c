// fuzz_boot.c: the multi-node bootstrap's reading of what arrives over its sockets, on arbitrary
// bytes, without sockets. Each input is a flags byte and the bytes received. Bit 0 clear: node 0
// (of a 4-node run of the tiny preset; bits 1-3: nodes 1-3 have joined) reads them as a hello
// (boot_hello_parse): a node joins only with an identity equal to node 0's but for its rank, a
// rank not taken and in range; a refusal is one line. Bit 0 set: a node reads them as node 0's
// reply header and what follows it (boot_reply_parse, boot_refusal_text): a refusal becomes one
// printable line.
#include "fuzz_util.h"
#include "../../vla/bootstrap.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static BootIdentity self;
    if (self.magic == 0) { self = fuzz_boot_identity(0); }
    if (size < 1) { return 0; }
    const uint8_t* msg = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        int fds[4] = {0, -1, -1, -1};
        for (int k = 1; k < 4; k++) { fds[k] = data[0] & (1 << k) ? 10 + k : -1; }
        int rank = -1;
        char why[320];
        why[0] = '\0';
        int hello = boot_hello_parse(&self, msg, n, fds, &rank, why, sizeof(why));
        if (hello == BOOT_HELLO_JOINS) {
            BootIdentity other;
            memcpy(&other, msg, sizeof(other));  // (a hello that joins has exactly its size)
            char diff[192];
            other.node_rank = 0;
            if (n != sizeof(other) || rank < 1 || rank > 3 || fds[rank] >= 0 || boot_identity_diff(&self, &other, diff, sizeof(diff))) {
                abort();
            }
        } else if (hello == BOOT_HELLO_REFUSED) {
            if (why[0] == '\0' || strchr(why, '\n') != NULL) { abort(); }
        } else if (hello != BOOT_HELLO_FOREIGN) {
            abort();
        }
        return 0;
    }
    uint32_t length = 0;
    size_t header = n < sizeof(BootReply) ? n : sizeof(BootReply);
    int kind = boot_reply_parse(msg, header, FUZZ_BOOT_PAYLOAD, 512, &length);
    if (kind == BOOT_REPLY_PAYLOAD && (header != sizeof(BootReply) || length != FUZZ_BOOT_PAYLOAD)) { abort(); }
    if (kind == BOOT_REPLY_REFUSED) {
        if (length >= 512) { abort(); }
        // the refusal's bytes: what followed the header, as many as it announced (the rest zero, as
        // a short read leaves the buffer)
        char raw[512], text[512];
        memset(raw, 0, sizeof(raw));
        size_t got = n - header < length ? n - header : length;
        memcpy(raw, msg + header, got);
        boot_refusal_text(raw, length, text, sizeof(text));
        for (const char* p = text; *p; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f) { abort(); }  // one printable line
        }
    }
    return 0;
}
