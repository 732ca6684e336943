/* A stand-in libcupti for CPU tests of tuiprof's injection library: it implements the CUPTI
 * entry points the library calls, and emits activity records (built by the test in CUPTI's
 * documented layout, read from FAKE_CUPTI_SCRIPT) through the buffer callbacks the library
 * registered, as CUPTI does on a GPU. Only CUPTI itself is faked: it cannot run without one. */
#define _GNU_SOURCE
#include <cupti_activity.h>
#include <cupti_version.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static CUpti_BuffersCallbackRequestFunc req;
static CUpti_BuffersCallbackCompleteFunc comp;
static uint32_t sizes[128];
static int enabled[128];
static uint8_t rt_on[4096], drv_on[4096];
static uint32_t flush_ms;
static unsigned long long attrs[16];   /* cuptiActivitySetAttribute's values, +1 (0: unset) */
static uint8_t *held;
static size_t held_size, held_valid;
static size_t dropped;

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r,
                                                    CUpti_BuffersCallbackCompleteFunc c) {
    req = r;
    comp = c;
    return CUPTI_SUCCESS;
}

/* Every kind switched, in order, one line each to FAKE_CUPTI_LOG when it names a file: what a
 * sampled program's bursts did. */
static void switch_log(const char *what, CUpti_ActivityKind kind) {
    const char *path = getenv("FAKE_CUPTI_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d\n", what, (int)kind);
    fclose(f);
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
    const char *refuse = getenv("FAKE_CUPTI_REFUSE");
    if (refuse && atoi(refuse) == (int)kind) return CUPTI_ERROR_NOT_COMPATIBLE;
    if ((unsigned)kind < 128) enabled[kind] = 1;
    switch_log("on", kind);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
    if ((unsigned)kind < 128) enabled[kind] = 0;
    switch_log("off", kind);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    if (held) {
        uint8_t *b = held;
        held = NULL;
        comp(NULL, 0, b, held_size, held_valid);
    }
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushPeriod(uint32_t ms) {
    flush_ms = ms;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid,
                                                CUpti_Activity **record) {
    uint8_t *p = *record ? (uint8_t *)*record + sizes[(*record)->kind] : buffer;
    if (p >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)p;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *n) {
    (void)ctx; (void)stream;
    *n = dropped;
    dropped = 0;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
    if (cbid < 4096) rt_on[cbid] = enable;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
    if (cbid < 4096) drv_on[cbid] = enable;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *ts) {  /* CLOCK_REALTIME + 5 us */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    *ts = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec + 5000;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *v) {
    *v = 999;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult r, const char **s) {
    (void)r;
    *s = "CUPTI_ERROR_FAKE";
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivitySetAttribute(CUpti_ActivityAttribute attr, size_t *size,
                                               void *value) {
    if ((unsigned)attr >= 16 || !size || !value) return CUPTI_ERROR_INVALID_PARAMETER;
    const char *refuse = getenv("FAKE_CUPTI_REFUSE_ATTR");
    if (refuse && atoi(refuse) == (int)attr) return CUPTI_ERROR_NOT_COMPATIBLE;
    unsigned long long v = 0;
    if (*size == 1) v = *(uint8_t *)value;
    else if (*size == sizeof(size_t)) v = *(size_t *)value;
    else return CUPTI_ERROR_INVALID_PARAMETER;
    attrs[attr] = v + 1;
    return CUPTI_SUCCESS;
}

/* What the library asked for, one line on stdout (the test reads the program's output), and
 * the attributes it set, if any, on a second line. */
void fake_cupti_report(void) {
    printf("fake-cupti: kinds");
    for (int k = 0; k < 128; k++)
        if (enabled[k]) printf(" %d", k);
    printf("; runtime");
    for (int i = 0; i < 4096; i++)
        if (rt_on[i]) printf(" %d", i);
    printf("; driver");
    for (int i = 0; i < 4096; i++)
        if (drv_on[i]) printf(" %d", i);
    printf("; flush %u\n", flush_ms);
    int any = 0;
    for (int a = 0; a < 16; a++) any |= attrs[a] != 0;
    if (any) {
        printf("fake-cupti-attrs:");
        for (int a = 0; a < 16; a++)
            if (attrs[a]) printf(" %d=%llu", a, attrs[a] - 1);
        printf("\n");
    }
    fflush(stdout);
}

static void patch(uint8_t *rec, size_t off, char **names, uint32_t n_names) {
    uint64_t idx;
    memcpy(&idx, rec + off, 8);
    const char *p = (idx && idx <= n_names) ? names[idx - 1] : NULL;
    memcpy(rec + off, &p, 8);
}

/* Emit the script's records: records_per_buffer to a buffer, each completed as CUPTI does,
 * except the last, which stays held until a flush (the library's exit flush). A refused buffer
 * request drops the record and counts it, as CUPTI does. Returns the records emitted. */
int fake_cupti_emit(const char *path, int records_per_buffer) {
    if (!req) return 0;  /* nobody registered (the session refused this process) */
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint32_t head[4];
    if (fread(head, 4, 4, f) != 4) return -1;
    uint32_t n_sizes = head[1], n_names = head[2], n_records = head[3];
    for (uint32_t i = 0; i < n_sizes; i++) {
        uint32_t ks[2];
        if (fread(ks, 4, 2, f) != 2) return -1;
        sizes[ks[0]] = ks[1];
    }
    char **names = calloc(n_names + 1, sizeof(char *));
    for (uint32_t i = 0; i < n_names; i++) {
        uint32_t len;
        if (fread(&len, 4, 1, f) != 1) return -1;
        names[i] = calloc(len + 1, 1);  /* kept for the process's life, as CUPTI keeps names */
        if (fread(names[i], 1, len, f) != len) return -1;
    }
    uint8_t *buf = NULL;
    size_t size = 0, valid = 0, max = 0;
    int in_buf = 0, emitted = 0;
    uint8_t rec[1024];
    for (uint32_t r = 0; r < n_records; r++) {
        uint32_t kind;
        if (fread(&kind, 4, 1, f) != 1) return -1;
        uint32_t sz = sizes[kind];
        memcpy(rec, &kind, 4);
        if (fread(rec + 4, 1, sz - 4, f) != sz - 4) return -1;
        if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) patch(rec, 104, names, n_names);
        if (kind == CUPTI_ACTIVITY_KIND_MARKER) {
            patch(rec, 40, names, n_names);
            patch(rec, 48, names, n_names);
        }
        if (kind == CUPTI_ACTIVITY_KIND_MEMORY2) patch(rec, 120, names, n_names);
        if (buf && (valid + sz > size || in_buf == records_per_buffer)) {
            comp(NULL, 0, buf, size, valid);
            buf = NULL;
        }
        if (!buf) {
            req(&buf, &size, &max);
            valid = 0;
            in_buf = 0;
            if (!buf) {
                dropped++;
                continue;
            }
        }
        memcpy(buf + valid, rec, sz);
        valid += sz;
        in_buf++;
        emitted++;
    }
    fclose(f);
    held = buf;
    held_size = size;
    held_valid = valid;
    return emitted;
}
