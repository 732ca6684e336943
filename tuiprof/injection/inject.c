/* tuiprof's injection library: CUPTI activity records of any CUDA program, handed raw to a
 * tuiprof session over a Unix socket.
 *
 * The CUDA driver loads this library when CUDA_INJECTION64_PATH names it and calls
 * InitializeInjection() from the program's first cuInit. From there:
 *   - libcupti is opened from TUIPROF_NATIVE_CUPTI (the session picked it; this library has no
 *     link-time dependency on it, so it always loads and can say why CUPTI did not);
 *   - the session at TUIPROF_NATIVE_CHANNEL is greeted (HELLO) and answers with what to collect
 *     (CONFIG): the same activity kinds as tuiprof's in-process path, and the runtime/driver
 *     API subset by callback id;
 *   - CUPTI fills buffers from a bounded pool; a completed buffer is queued and a sender thread
 *     writes it to the socket as it is (BUFFER), preceded by the strings its records point to
 *     (kernel names, NVTX marker names, memory sources: STRINGS) and by the record sizes it
 *     measured (SIZES). The session parses the buffer with its raw-buffer parser.
 *   - at exit (atexit, and a destructor for an unload), CUPTI is flushed, the queue drained for
 *     at most TUIPROF_NATIVE_EXIT_WAIT_MS, and the final counts are sent (END).
 *
 * Backpressure: no CUDA thread ever waits on the session. The pool holds at most max_buffers
 * buffers; when all are queued or in CUPTI's hands, a buffer request is refused and CUPTI drops
 * (and counts) the records it could not write; both counts reach the session (STATS, END). A
 * broken channel turns the library inert: buffers are recycled unsent and counted as lost.
 *
 * Nothing here is Python; the protocol is described in tuiprof/collect/cupti_channel.py. */
#define _GNU_SOURCE
#include <cupti_activity.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* --- protocol (the same numbers are in tuiprof/collect/cupti_channel.py) --- */
#define TP_MAGIC 0x46525054u /* "TPRF" */
#define TP_PROTO 2
#define TP_MSG_HELLO 1
#define TP_MSG_STRINGS 2
#define TP_MSG_SIZES 3
#define TP_MSG_BUFFER 4
#define TP_MSG_STATS 5
#define TP_MSG_ERROR 6
#define TP_MSG_END 7
#define TP_MSG_CONFIG 8
#define TP_MSG_FLUSH 9   /* session -> program: flush CUPTI now (before it signals the program) */
#define TP_MSG_FLUSHED 10
#define TP_MSG_TRACE 11  /* session -> program: u32 on; kernel tracing on (a burst) or off */
#define TP_MSG_TRACED 12 /* program -> session: u32 on, u32 0, u64 CUPTI time of the switch */
#define TP_FLAG_API 1u
#define TP_FLAG_MEMORY 2u
#define TP_FLAG_MARKERS 4u
#define TP_FLAG_GRAPHS 8u   /* graph-level trace: one GRAPH_TRACE record per graph launch */
#define TP_FLAG_SAMPLED 16u /* kernel tracing starts off; the session's TRACE frames switch it */

/* Field offsets read by the sender: the same in every CUPTI 12.x/13.x record version (and
 * those tuiprof/collect/cupti_raw.py reads). */
#define TP_OFF_KERNEL_NAME 104
#define TP_OFF_MEMORY_SOURCE 120
#define TP_OFF_MARKER_NAME 40
#define TP_OFF_MARKER_DOMAIN 48

#define TP_MAX_BUFFERS 256
#define TP_MAX_STRING 65536
#define TP_SEEN_SLOTS 16384 /* kernel-name/source pointers already sent (open addressing) */
#define TP_MAX_KIND 128

struct tp_header {
    uint32_t magic;
    uint32_t type;
    uint64_t length;
};

struct tp_stats {
    uint64_t dropped;  /* records CUPTI dropped (its own count, summed) */
    uint64_t refused;  /* buffer requests refused: every pool buffer was queued or in use */
    uint64_t buffers;  /* buffers sent */
    uint64_t bytes;    /* record bytes sent */
    uint64_t lost;     /* buffers not sent: the channel was broken */
};

struct tp_config {
    uint32_t accept;
    uint32_t flags;
    uint32_t buffer_bytes;
    uint32_t max_buffers;
    uint32_t flush_period_ms;
    uint32_t exit_wait_ms;
    uint32_t n_runtime;
    uint32_t n_driver;
};

/* --- CUPTI entry points, resolved at run time --- */
static __typeof__(cuptiActivityRegisterCallbacks) *p_register;
static __typeof__(cuptiActivityEnable) *p_enable;
static __typeof__(cuptiActivityDisable) *p_disable;
static __typeof__(cuptiActivityFlushAll) *p_flush_all;
static __typeof__(cuptiActivityFlushPeriod) *p_flush_period;
static __typeof__(cuptiActivityGetNextRecord) *p_next_record;
static __typeof__(cuptiActivityGetNumDroppedRecords) *p_dropped;
static __typeof__(cuptiActivityEnableRuntimeApi) *p_enable_runtime;
static __typeof__(cuptiActivityEnableDriverApi) *p_enable_driver;
static __typeof__(cuptiGetTimestamp) *p_timestamp;
static __typeof__(cuptiGetVersion) *p_version;
static __typeof__(cuptiGetResultString) *p_result_string;

/* --- state --- */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;  /* the sender has work */
static pthread_cond_t cv_idle = PTHREAD_COND_INITIALIZER;  /* the sender finished a buffer */
static pthread_mutex_t send_mu = PTHREAD_MUTEX_INITIALIZER; /* one frame at a time */
static int sock = -1;
static pid_t owner;           /* the process that connected (a forked child is not it) */
static int active;            /* CUPTI collecting into our buffers */
static volatile int broken;   /* the channel failed: nothing more is sent */
static int closing;           /* exit: the sender drains and stops */
static int finished;          /* the exit path ran */
static int sender_busy;
static pthread_t sender;
static size_t buffer_bytes = 4u << 20;
static int max_buffers = 16;
static int allocated;
static void *free_list[TP_MAX_BUFFERS];
static int n_free;
static struct { uint8_t *buf; size_t valid; } queue[TP_MAX_BUFFERS];
static int q_head, q_len;
static struct tp_stats stats;
static uint32_t exit_wait_ms = 10000;
static uint64_t seen[TP_SEEN_SLOTS];
static int n_seen;
static uint32_t kind_size[TP_MAX_KIND];
static struct timespec last_stats;
static uint32_t cfg_flags;
static uint32_t *api_ids;      /* the API subset (runtime ids, then driver ids), kept for bursts */
static uint32_t n_rt_ids, n_drv_ids;
static int tracing;            /* the kernel-level kinds are on */
static int graph_between;      /* TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS=1: GRAPH_TRACE between bursts */
static int memory_bursts;      /* TUIPROF_CUPTI_MEMORY_BURSTS=1: MEMORY2 only in bursts */
static int api_clear;          /* TUIPROF_CUPTI_API_CLEAR=1: the API subset's ids off between bursts */
static int no_bursts;          /* TUIPROF_CUPTI_NO_BURSTS=1: TRACE frames answered, no kind switched */
static int lazy;               /* TUIPROF_CUPTI_LAZY=1: CUPTI attached at the first burst */
static int attached;           /* CUPTI's buffer callbacks registered, the lasting kinds on */
static void *cupti_handle;
static uint32_t flush_ms;

/* --- writing frames --- */
static int write_all(const struct iovec *iov_in, int n) {
    struct iovec iov[8];
    memcpy(iov, iov_in, sizeof(struct iovec) * (size_t)n);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    while (msg.msg_iovlen) {
        ssize_t w = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (msg.msg_iovlen && (size_t)w >= msg.msg_iov[0].iov_len) {
            w -= (ssize_t)msg.msg_iov[0].iov_len;
            msg.msg_iov++;
            msg.msg_iovlen--;
        }
        if (msg.msg_iovlen) {
            msg.msg_iov[0].iov_base = (char *)msg.msg_iov[0].iov_base + w;
            msg.msg_iov[0].iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* One frame of up to three payload parts; 0 or -1 (then the channel is broken). */
static int send_frame(uint32_t type, const void *a, size_t na, const void *b, size_t nb) {
    if (broken || sock < 0) return -1;
    struct tp_header h = {TP_MAGIC, type, (uint64_t)(na + nb)};
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)a, na}, {(void *)b, nb}};
    pthread_mutex_lock(&send_mu);
    int r = write_all(iov, nb ? 3 : (na ? 2 : 1));
    pthread_mutex_unlock(&send_mu);
    if (r) broken = 1;
    return r;
}

static void send_error(const char *fmt, ...) {
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof text) n = (int)sizeof text - 1;
    if (send_frame(TP_MSG_ERROR, text, (size_t)n, NULL, 0))
        fprintf(stderr, "tuiprof: %s\n", text);
}

static const char *result_text(CUptiResult r) {
    const char *s = NULL;
    if (p_result_string && p_result_string(r, &s) == CUPTI_SUCCESS && s) return s;
    return "unknown CUPTI error";
}

/* --- the buffer pool (CUPTI's callbacks; never blocks) --- */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    void *p = NULL;
    pthread_mutex_lock(&mu);
    if (n_free) {
        p = free_list[--n_free];
    } else if (allocated < max_buffers) {
        if (posix_memalign(&p, 8, buffer_bytes) == 0) allocated++;
        else p = NULL;
    }
    if (!p) stats.refused++;
    pthread_mutex_unlock(&mu);
    *buffer = (uint8_t *)p;
    *size = p ? buffer_bytes : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx; (void)stream; (void)size;
    if (!buffer) return;
    pthread_mutex_lock(&mu);
    if (valid && !broken) {  /* the queue holds every pool buffer: it cannot overflow */
        queue[(q_head + q_len) % TP_MAX_BUFFERS].buf = buffer;
        queue[(q_head + q_len) % TP_MAX_BUFFERS].valid = valid;
        q_len++;
        pthread_cond_signal(&cv_work);
    } else {
        if (valid) stats.lost++;
        free_list[n_free++] = buffer;
    }
    pthread_mutex_unlock(&mu);
}

/* --- the sender thread --- */
static int seen_add(uint64_t p) {  /* 1 if newly added (send it), 0 if already sent */
    if (n_seen >= TP_SEEN_SLOTS / 2) return 1;  /* full: send every time (correct, larger) */
    uint64_t h = (p >> 3) * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 50) % TP_SEEN_SLOTS;; i = (i + 1) % TP_SEEN_SLOTS) {
        if (seen[i] == p) return 0;
        if (!seen[i]) {
            seen[i] = p;
            n_seen++;
            return 1;
        }
    }
}

struct strbuf { uint8_t *data; size_t len, cap; };

static void str_add(struct strbuf *sb, const char *s, uint32_t transient) {
    if (!s) return;
    if (!transient && !seen_add((uint64_t)(uintptr_t)s)) return;
    size_t n = strnlen(s, TP_MAX_STRING);
    size_t need = sb->len + 16 + ((n + 7) & ~(size_t)7);
    if (need > sb->cap) {
        size_t cap = sb->cap ? sb->cap * 2 : 65536;
        while (cap < need) cap *= 2;
        uint8_t *d = realloc(sb->data, cap);
        if (!d) return;
        sb->data = d;
        sb->cap = cap;
    }
    uint64_t ptr = (uint64_t)(uintptr_t)s;
    uint32_t len = (uint32_t)n;
    memcpy(sb->data + sb->len, &ptr, 8);
    memcpy(sb->data + sb->len + 8, &len, 4);
    memcpy(sb->data + sb->len + 12, &transient, 4);
    memcpy(sb->data + sb->len + 16, s, n);
    memset(sb->data + sb->len + 16 + n, 0, ((n + 7) & ~(size_t)7) - n);
    sb->len = need;
}

static const char *ptr_at(const uint8_t *rec, size_t off) {
    const char *p;
    memcpy(&p, rec + off, sizeof p);
    return p;
}

/* The strings a buffer's records point to, and the record sizes not reported yet. */
static void walk(uint8_t *buf, size_t valid, struct strbuf *sb, uint32_t *sizes, int *n_sizes) {
    CUpti_Activity *rec = NULL, *prev = NULL;
    while (p_next_record(buf, valid, &rec) == CUPTI_SUCCESS) {
        const uint8_t *r = (const uint8_t *)rec;
        if (prev && prev->kind < TP_MAX_KIND && !kind_size[prev->kind]) {
            kind_size[prev->kind] = (uint32_t)(r - (const uint8_t *)prev);
            sizes[2 * *n_sizes] = prev->kind;
            sizes[2 * *n_sizes + 1] = kind_size[prev->kind];
            ++*n_sizes;
        }
        switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            str_add(sb, ptr_at(r, TP_OFF_KERNEL_NAME), 0);
            break;
        case CUPTI_ACTIVITY_KIND_MEMORY2:
            str_add(sb, ptr_at(r, TP_OFF_MEMORY_SOURCE), 0);
            break;
        case CUPTI_ACTIVITY_KIND_MARKER: /* not shared like kernel names: sent every time */
            str_add(sb, ptr_at(r, TP_OFF_MARKER_NAME), 1);
            str_add(sb, ptr_at(r, TP_OFF_MARKER_DOMAIN), 1);
            break;
        default:
            break;
        }
        prev = rec;
    }
}

static void stats_copy(struct tp_stats *out) {
    size_t n = 0;
    if (p_dropped && p_dropped(NULL, 0, &n) == CUPTI_SUCCESS) {
        pthread_mutex_lock(&mu);
        stats.dropped += n;
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_lock(&mu);
    *out = stats;
    pthread_mutex_unlock(&mu);
}

static void send_buffer(uint8_t *buf, size_t valid) {
    struct strbuf sb = {0};
    uint32_t sizes[2 * TP_MAX_KIND];
    int n_sizes = 0;
    walk(buf, valid, &sb, sizes, &n_sizes);
    int bad = 0;
    if (n_sizes) bad |= send_frame(TP_MSG_SIZES, sizes, (size_t)n_sizes * 8, NULL, 0);
    if (sb.len && !bad) bad |= send_frame(TP_MSG_STRINGS, sb.data, sb.len, NULL, 0);
    if (!bad) bad |= send_frame(TP_MSG_BUFFER, buf, valid, NULL, 0);
    free(sb.data);
    pthread_mutex_lock(&mu);
    if (bad) {
        stats.lost++;
    } else {
        stats.buffers++;
        stats.bytes += valid;
    }
    pthread_mutex_unlock(&mu);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!bad && now.tv_sec - last_stats.tv_sec >= 1) {
        last_stats = now;
        struct tp_stats s;
        stats_copy(&s);
        send_frame(TP_MSG_STATS, &s, sizeof s, NULL, 0);
    }
}

static int read_all(void *p, size_t n);
static void set_tracing(int on);

/* A frame from the session, read by the sender thread: FLUSH (it is about to signal the
 * program: CUPTI's buffers are completed here, queued, sent by this thread, then FLUSHED says
 * so; returns 1) or TRACE (a sampling burst begins or ends: the kinds are switched here, on
 * this thread, never on one of the program's, and TRACED gives the switch's CUPTI time). */
static int control_frame(void) {
    struct tp_header h;
    ssize_t n = recv(sock, &h, sizeof h, MSG_DONTWAIT | MSG_PEEK);
    if (n < (ssize_t)sizeof h) return 0;
    if (recv(sock, &h, sizeof h, MSG_DONTWAIT) != (ssize_t)sizeof h) return 0;
    if (h.magic != TP_MAGIC) return 0;
    if (h.type == TP_MSG_TRACE && h.length == 4) {
        uint32_t on = 0;
        struct timeval tv = {2, 0};  /* the payload follows its header at once */
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        int bad = read_all(&on, sizeof on);
        struct timeval none = {0, 0};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
        if (bad) return 0;
        set_tracing(on != 0);
        return 0;
    }
    return h.type == TP_MSG_FLUSH;
}

static void *sender_main(void *arg) {
    (void)arg;
    int flushed_due = 0;
    for (;;) {
        if (!broken && sock >= 0 && control_frame()) {
            if (attached) p_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
            flushed_due = 1;
        }
        pthread_mutex_lock(&mu);
        if (!q_len && flushed_due) {
            pthread_mutex_unlock(&mu);
            struct tp_stats s;
            stats_copy(&s);
            send_frame(TP_MSG_FLUSHED, &s, sizeof s, NULL, 0);
            flushed_due = 0;
            continue;
        }
        if (!q_len && !closing) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100000000L;  /* look at the socket ten times a second */
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&cv_work, &mu, &until);
        }
        if (!q_len) {
            int done = closing;
            pthread_mutex_unlock(&mu);
            if (done) return NULL;
            continue;
        }
        uint8_t *buf = queue[q_head].buf;
        size_t valid = queue[q_head].valid;
        q_head = (q_head + 1) % TP_MAX_BUFFERS;
        q_len--;
        sender_busy = 1;
        pthread_mutex_unlock(&mu);
        if (!broken) {
            send_buffer(buf, valid);
        } else {
            pthread_mutex_lock(&mu);
            stats.lost++;
            pthread_mutex_unlock(&mu);
        }
        pthread_mutex_lock(&mu);
        free_list[n_free++] = buf;
        sender_busy = 0;
        pthread_cond_broadcast(&cv_idle);
        pthread_mutex_unlock(&mu);
    }
}

/* --- exit --- */
static void finish(void) {
    if (!active || finished || getpid() != owner) return;
    finished = 1;
    if (attached) p_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  /* every buffer queued now */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += exit_wait_ms / 1000;
    deadline.tv_nsec += (long)(exit_wait_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    closing = 1;
    pthread_cond_signal(&cv_work);
    int timed_out = 0;
    while ((q_len || sender_busy) && !broken && !timed_out)
        timed_out = pthread_cond_timedwait(&cv_idle, &mu, &deadline) == ETIMEDOUT;
    int left = q_len + sender_busy;
    pthread_mutex_unlock(&mu);
    if (timed_out) {  /* the session does not read: leave without the rest (counted) */
        pthread_mutex_lock(&mu);
        stats.lost += (uint64_t)left;
        pthread_mutex_unlock(&mu);
        broken = 1;
        return;
    }
    struct tp_stats s;
    stats_copy(&s);
    send_frame(TP_MSG_END, &s, sizeof s, NULL, 0);
    if (sock >= 0) shutdown(sock, SHUT_WR);
}

__attribute__((destructor)) static void on_unload(void) { finish(); }

/* --- start --- */
/* Where CUPTI keeps its records on the device. Since CUDA 12.0 Update 1 it reserves device
 * buffers per context at its creation (CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE of
 * them, 3 by default, of DEVICE_BUFFER_SIZE, ~3.2 MB, each taking 4 MiB), before any of the
 * program's memory, so the program's buffers land further on; and a kernel's own speed moves
 * with where its buffers land (decode_like's argmax_token by up to 19 % with no tool loaded:
 * docs/native.md, "Placement"). nsys 2025.3 leaves 28 MiB in use at that point, and with the
 * same 28 MiB (7 buffers) a program's kernels run under tuiprof at the speed they run under
 * nsys, their own clocks equal at three layouts; with CUPTI's 12 MiB they do not. So tuiprof
 * reserves nsys's 28 MiB by default, and kernel times can be compared with the tool everyone
 * checks against. TUIPROF_CUPTI_HOST_PINNED=1 keeps the records in pinned host memory
 * instead: nothing is reserved on the device and the kernels run as they do with no tool.
 *   TUIPROF_CUPTI_DEVICE_BUFFERS     device buffers reserved at context creation (default 7;
 *                                    3 is CUPTI's own default)
 *   TUIPROF_CUPTI_DEVICE_BUFFER_MB   bytes of each buffer, in MiB (CUPTI's own by default)
 *   TUIPROF_CUPTI_HOST_PINNED=1      records in pinned host memory instead of device memory */
#define TP_DEVICE_BUFFERS_DEFAULT "7"
static void device_buffer_attrs(void *lib) {
    CUptiResult (*set_attr)(CUpti_ActivityAttribute, size_t *, void *);
    *(void **)(&set_attr) = dlsym(lib, "cuptiActivitySetAttribute");
    if (!set_attr) return;
    static const struct {
        const char *env, *fallback;
        CUpti_ActivityAttribute attr;
        int shift;
    } knobs[] = {
        {"TUIPROF_CUPTI_DEVICE_BUFFER_MB", NULL, CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, 20},
        {"TUIPROF_CUPTI_DEVICE_BUFFERS", TP_DEVICE_BUFFERS_DEFAULT,
         CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 0},
    };
    const char *pinned = getenv("TUIPROF_CUPTI_HOST_PINNED");
    int host = pinned && *pinned == '1';
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        const char *v = getenv(knobs[i].env);
        int asked = v && *v;
        if (!asked) v = host ? NULL : knobs[i].fallback;  /* nsys's footprint is on the device */
        if (!v) continue;
        size_t value = (size_t)strtoull(v, NULL, 10) << knobs[i].shift, size = sizeof value;
        CUptiResult r = set_attr(knobs[i].attr, &size, &value);
        /* a CUPTI older than device buffers refuses the default, and has nothing to move */
        if (r != CUPTI_SUCCESS && asked)
            send_error("%s=%s: CUPTI said %s", knobs[i].env, v, result_text(r));
    }
    if (host) {
        uint8_t on = 1;
        size_t size = sizeof on;
        CUptiResult r = set_attr(CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, &size, &on);
        if (r != CUPTI_SUCCESS) send_error("TUIPROF_CUPTI_HOST_PINNED: CUPTI said %s", result_text(r));
    }
}

static int resolve(void *lib) {
#define TP_SYM(var, name)                                                   \
    do {                                                                    \
        *(void **)(&var) = dlsym(lib, name);                                \
        if (!var) {                                                         \
            send_error("libcupti has no %s (CUPTI older than 12?)", name);  \
            return -1;                                                      \
        }                                                                   \
    } while (0)
    TP_SYM(p_register, "cuptiActivityRegisterCallbacks");
    TP_SYM(p_enable, "cuptiActivityEnable");
    TP_SYM(p_disable, "cuptiActivityDisable");
    TP_SYM(p_flush_all, "cuptiActivityFlushAll");
    TP_SYM(p_flush_period, "cuptiActivityFlushPeriod");
    TP_SYM(p_next_record, "cuptiActivityGetNextRecord");
    TP_SYM(p_dropped, "cuptiActivityGetNumDroppedRecords");
    TP_SYM(p_enable_runtime, "cuptiActivityEnableRuntimeApi");
    TP_SYM(p_enable_driver, "cuptiActivityEnableDriverApi");
    TP_SYM(p_timestamp, "cuptiGetTimestamp");
    TP_SYM(p_version, "cuptiGetVersion");
    TP_SYM(p_result_string, "cuptiGetResultString");
#undef TP_SYM
    return 0;
}

static int read_all(void *p, size_t n) {
    uint8_t *d = p;
    while (n) {
        ssize_t r = recv(sock, d, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        d += r;
        n -= (size_t)r;
    }
    return 0;
}

static int connect_channel(const char *path) {
    struct sockaddr_un addr;
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};  /* the session answers HELLO at once; never hang cuInit */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Enable one kind; -1 (and the reason sent) if CUPTI refuses. */
static int enable(CUpti_ActivityKind kind, const char *name) {
    CUptiResult r = p_enable(kind);
    if (r != CUPTI_SUCCESS) {
        send_error("CUPTI refused activity kind %s: %s", name, result_text(r));
        return -1;
    }
    return 0;
}

static int api_subset(const uint32_t *ids, uint32_t n, int runtime) {
    uint32_t size = runtime ? CUPTI_RUNTIME_TRACE_CBID_SIZE : CUPTI_DRIVER_TRACE_CBID_SIZE;
    uint8_t *want = calloc(size, 1);
    if (!want) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < size) want[ids[i]] = 1;
    for (uint32_t cb = 1; cb < size; cb++) /* every id set: a kind on alone delivers all */
        (runtime ? p_enable_runtime : p_enable_driver)(cb, want[cb]);
    free(want);
    return 0;
}

/* The kernel-level kinds, switched together: kernels, copies, sets and the API subset (the API
 * kinds delivered alone give every call, so the subset is applied again at each switch on). A
 * burst of a sampled program turns them on and off; memory and NVTX records stay on, and so
 * does GRAPH_TRACE in graph-level mode. CUPTI documents that once GRAPH_TRACE is enabled the
 * session traces graphs at graph level, and that disabling it does not bring node-level
 * tracing back (cupti_activity.h, CUDA 13.5): so the graph-level mode is chosen at the start,
 * for the program's life. TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS=1 tries the switch anyway
 * (GRAPH_TRACE off for each burst, on between), to see what a given CUPTI does.
 * What an attached CUPTI costs a program between bursts is probed by three more switches:
 * TUIPROF_CUPTI_MEMORY_BURSTS=1 (MEMORY2 on in bursts only), TUIPROF_CUPTI_API_CLEAR=1 (every
 * API id switched off at a burst's end, not only the API kinds) and TUIPROF_CUPTI_NO_BURSTS=1
 * (TRACE frames answered, nothing switched: CUPTI attached with no kernel kind ever on);
 * with TUIPROF_CUPTI_LAZY=1 too, CUPTI is never attached at all. */
static void lasting(void) {  /* the kinds on all run, after any kernel kind */
    if ((cfg_flags & TP_FLAG_MEMORY) && !memory_bursts)
        enable(CUPTI_ACTIVITY_KIND_MEMORY2, "MEMORY2");
    if (cfg_flags & TP_FLAG_MARKERS) enable(CUPTI_ACTIVITY_KIND_MARKER, "MARKER");
    if (flush_ms) p_flush_period(flush_ms);
}

/* CUPTI's buffer callbacks and the kinds that stay on all run (memory, NVTX markers), with
 * the device buffers' placement and the flush period: at InitializeInjection, or at the first
 * burst with TUIPROF_CUPTI_LAZY=1 (a probe: what CUPTI attached costs a program before it). */
static int attach(void) {
    if (attached) return 0;
    device_buffer_attrs(cupti_handle);
    CUptiResult r = p_register(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        send_error("CUPTI refused its buffer callbacks: %s (another profiler holds CUPTI?)",
                   result_text(r));
        return -1;
    }
    attached = 1;
    if (lazy) lasting();
    return 0;
}

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v == '1';
}

static void set_tracing(int on) {
    if (on == tracing || !p_disable) return;
    if (no_bursts) {  /* what CUPTI attached costs with no burst at all (an overhead probe) */
        uint64_t now = 0;
        p_timestamp(&now);
        tracing = on;
        struct { uint32_t on, pad; uint64_t ts; } m = {(uint32_t)on, 0, now};
        send_frame(TP_MSG_TRACED, &m, sizeof m, NULL, 0);
        return;
    }
    if (on && attach()) return;
    if (on && graph_between) p_disable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
    static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                               CUPTI_ACTIVITY_KIND_MEMCPY,
                                               CUPTI_ACTIVITY_KIND_MEMSET};
    uint64_t ts = 0;
    if (!on) p_timestamp(&ts);  /* the burst's end: before its kinds go */
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        (on ? p_enable : p_disable)(kinds[i]);
    if (cfg_flags & TP_FLAG_API) {
        (on ? p_enable : p_disable)(CUPTI_ACTIVITY_KIND_RUNTIME);
        (on ? p_enable : p_disable)(CUPTI_ACTIVITY_KIND_DRIVER);
        if (on && api_ids) {
            api_subset(api_ids, n_rt_ids, 1);
            api_subset(api_ids + n_rt_ids, n_drv_ids, 0);
        } else if (!on && api_clear) {  /* no id left asked for between bursts */
            api_subset(NULL, 0, 1);
            api_subset(NULL, 0, 0);
        }
    }
    if (memory_bursts && (cfg_flags & TP_FLAG_MEMORY))
        (on ? p_enable : p_disable)(CUPTI_ACTIVITY_KIND_MEMORY2);
    if (on) p_timestamp(&ts);   /* the burst's start: once its kinds are on */
    if (!on && graph_between) p_enable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
    tracing = on;
    struct { uint32_t on, pad; uint64_t ts; } msg = {(uint32_t)on, 0, ts};
    send_frame(TP_MSG_TRACED, &msg, sizeof msg, NULL, 0);
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
    const char *chan = getenv("TUIPROF_NATIVE_CHANNEL");
    const char *lib_path = getenv("TUIPROF_NATIVE_CUPTI");
    if (!chan || !lib_path || sock >= 0) return 1;
    sock = connect_channel(chan);
    if (sock < 0) {
        fprintf(stderr, "tuiprof: cannot reach the tuiprof session at %s (%s); this process "
                "runs unprofiled\n", chan, strerror(errno));
        return 1;
    }
    owner = getpid();
    void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        send_error("the program could not load libcupti (%s): %s", lib_path, why ? why : "?");
        return 1;
    }
    if (resolve(lib)) return 1;
    uint32_t version = 0;
    p_version(&version);
    uint64_t ts = 0;
    struct timespec rt;
    p_timestamp(&ts);
    clock_gettime(CLOCK_REALTIME, &rt);
    uint32_t hello[8] = {TP_PROTO, (uint32_t)owner, version, 0};
    uint64_t clocks[2] = {ts, (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec};
    memcpy(&hello[4], clocks, sizeof clocks);
    if (send_frame(TP_MSG_HELLO, hello, sizeof hello, NULL, 0)) return 1;

    struct tp_header h;
    struct tp_config cfg;
    if (read_all(&h, sizeof h) || h.magic != TP_MAGIC || h.type != TP_MSG_CONFIG ||
        h.length < sizeof cfg || h.length > sizeof cfg + 4 * 65536 || read_all(&cfg, sizeof cfg)) {
        fprintf(stderr, "tuiprof: no answer from the tuiprof session; this process runs "
                "unprofiled\n");
        broken = 1;
        return 1;
    }
    size_t n_ids = (size_t)(h.length - sizeof cfg) / 4;
    uint32_t *ids = calloc(n_ids ? n_ids : 1, 4);
    if (!ids || read_all(ids, n_ids * 4) || cfg.n_runtime + cfg.n_driver > n_ids) {
        free(ids);
        broken = 1;
        return 1;
    }
    if (!cfg.accept) {  /* another process of the program is the one profiled */
        free(ids);
        broken = 1;
        close(sock);
        sock = -1;
        return 1;
    }
    if (cfg.buffer_bytes >= 65536) buffer_bytes = cfg.buffer_bytes & ~(size_t)7;
    if (cfg.max_buffers >= 2)
        max_buffers = cfg.max_buffers > TP_MAX_BUFFERS ? TP_MAX_BUFFERS : (int)cfg.max_buffers;
    exit_wait_ms = cfg.exit_wait_ms;
    struct timeval tv = {0, 0};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    cfg_flags = cfg.flags;
    cupti_handle = lib;
    flush_ms = cfg.flush_period_ms;
    memory_bursts = env_on("TUIPROF_CUPTI_MEMORY_BURSTS") && (cfg.flags & TP_FLAG_SAMPLED);
    api_clear = env_on("TUIPROF_CUPTI_API_CLEAR");
    no_bursts = env_on("TUIPROF_CUPTI_NO_BURSTS") && (cfg.flags & TP_FLAG_SAMPLED);
    lazy = env_on("TUIPROF_CUPTI_LAZY") && (cfg.flags & TP_FLAG_SAMPLED) &&
           !(cfg.flags & TP_FLAG_GRAPHS);
    if (!lazy && attach()) {
        free(ids);
        return 1;
    }
    if (pthread_create(&sender, NULL, sender_main, NULL)) {
        send_error("could not start the sender thread");
        free(ids);
        return 1;
    }
    int bad = 0;
    const char *gb = getenv("TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS");
    graph_between = gb && *gb == '1' && (cfg.flags & TP_FLAG_SAMPLED) &&
                    !(cfg.flags & TP_FLAG_GRAPHS) && !lazy;
    /* graph-level first: it selects how the session traces graphs before any kernel kind */
    if (cfg.flags & TP_FLAG_GRAPHS) bad |= enable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE, "GRAPH_TRACE");
    if (graph_between) bad |= enable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE, "GRAPH_TRACE");
    if (!(cfg.flags & TP_FLAG_SAMPLED)) {
        bad |= enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL");
        bad |= enable(CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY");
        bad |= enable(CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET");
        tracing = 1;
    }
    if ((cfg.flags & TP_FLAG_API) && !(cfg.flags & TP_FLAG_SAMPLED)) {
        bad |= enable(CUPTI_ACTIVITY_KIND_RUNTIME, "RUNTIME");
        bad |= enable(CUPTI_ACTIVITY_KIND_DRIVER, "DRIVER");
        api_subset(ids, cfg.n_runtime, 1);
        api_subset(ids + cfg.n_runtime, cfg.n_driver, 0);
    }
    api_ids = ids;  /* kept: each burst applies the subset again */
    n_rt_ids = cfg.n_runtime;
    n_drv_ids = cfg.n_driver;
    (void)bad;  /* what CUPTI refused was said; the rest is collected */
    if (!lazy) lasting();
    clock_gettime(CLOCK_MONOTONIC, &last_stats);
    active = 1;
    atexit(finish);
    return 1;
}
