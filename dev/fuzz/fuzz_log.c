// fuzz_log.c: logger_open's reading of an existing log.jsonl on arbitrary bytes. A resume reads
// the log a run folder holds and rewrites it without the lines past the step it resumes from.
// Each input is that step (2 bytes, little-endian) and the log's bytes, written as log.jsonl in a
// folder of this process; logger_open and logger_close run on it, and the log they leave must be
// the input's complete lines in their order, less some, with none of a step past the start, and
// no temporary file beside it.
#include "fuzz_util.h"
#include "../../vla/logging.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) { return 0; }
    int start = data[0] | (data[1] << 8);
    const char* dir = fuzz_subdir("run");
    char path[VLA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/log.jsonl", dir);
    FILE* f = fopenCheck(path, "wb");
    if (fwrite(data + 2, 1, size - 2, f) != size - 2 || fclose(f) != 0) { perror("writing log.jsonl"); abort(); }

    Logger lg;
    memset(&lg, 0, sizeof(lg));
    logger_open(&lg, dir, start);
    logger_close(&lg);

    size_t n;
    f = fopenCheck(path, "rb");
    uint8_t* out = (uint8_t*)mallocCheck(size + 1);
    n = fread(out, 1, size + 1, f);
    fclose(f);
    if (n > size - 2) { abort(); }  // the log never grows on opening
    // every line left is complete, is a whole line of the input (found in order), and is no step past the start
    const uint8_t* in = data + 2;
    size_t in_n = size - 2, at = 0;
    for (size_t i = 0; i < n;) {
        const uint8_t* eol = (const uint8_t*)memchr(out + i, '\n', n - i);
        if (eol == NULL) { abort(); }
        size_t len = (size_t)(eol - (out + i)) + 1;
        int step;
        char* line = (char*)mallocCheck(len + 1);
        memcpy(line, out + i, len);
        line[len] = '\0';
        if (sscanf(line, "{\"step\": %d", &step) == 1 && step > start) { abort(); }
        free(line);
        // the next input line equal to this one, at a line start
        while (at < in_n && !(at + len <= in_n && memcmp(in + at, out + i, len) == 0)) {
            const uint8_t* next = (const uint8_t*)memchr(in + at, '\n', in_n - at);
            at = next == NULL ? in_n : (size_t)(next - in) + 1;
        }
        if (at >= in_n) { abort(); }
        at += len;
        i += len;
    }
    free(out);
    DIR* d = opendir(dir);
    for (struct dirent* de = readdir(d); de != NULL; de = readdir(d)) {
        if (strstr(de->d_name, ".tmp") != NULL) { abort(); }  // a rewrite leaves no temporary file
    }
    closedir(d);
    fuzz_clear_dir(dir);
    return 0;
}
