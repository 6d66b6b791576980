/*
 * A small fake of NVML (libnvidia-ml.so.1) for tests without a GPU.
 *
 * The real `pynvml` loads it like the driver's library, so the auditor's NVML reader runs
 * unchanged. Devices come from a script file named by FAKE_NVML_SCRIPT, re-read whenever
 * the file changes (tests rewrite it to make a GPU disappear or a call fail). One record a
 * line; `#` starts a comment; names use `+` for a space:
 *
 *   init fail=9                          nvmlInit returns this code
 *   device uuid=GPU-a name=NVIDIA+H100 mem_total=81559 mem_used=1024 util=40 power_mw=300000
 *          sm_clock=1980 throttle=4 temp=55 samples=scripted|synthetic|none sample_us=166667
 *          lost=1 mig_max=7               (one line in the file)
 *          sm_util=12                    (GPM SM utilisation, percent: Hopper and later; absent:
 *                                         the device does not support GPM)
 *          pcie_tx=1000 pcie_rx=2000     (nvmlDeviceGetPcieThroughput, KB/s)
 *          pcie_gen=4 pcie_width=16      (current PCIe link generation and width)
 *          nvlinks=12 nvlink_tx=5 nvlink_rx=7   (NVLink links, and each link's data counters
 *                                         NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX in KiB, each
 *                                         advancing by this many KiB per read)
 *   sample ts_us=1700000000000000 value=35      a buffered utilisation sample of the last device
 *   mig uuid=MIG-a name=... mem_total=... mem_used=...      a MIG instance of the last device
 *                                        (its name ends with its profile: NVIDIA+A100+MIG+1g.5gb)
 *   proc pid=4242 sm=30 ts_us=...        a process utilisation sample of the last device (no
 *                                        ts_us: stamped at the call, as a running process is)
 *   procs fail=3                         nvmlDeviceGetProcessUtilization of the last device
 *                                        answers this code
 *   (the `proc` pids of a device are also its running compute processes)
 *
 * A field that is absent answers NVML_ERROR_NOT_SUPPORTED; a value `E<code>` answers that
 * error code (E15 GPU is lost, E999 unknown). `lost=1` makes every call on the device answer
 * GPU_IS_LOST. `samples=synthetic` fills the buffer with one sample every sample_us up to
 * now (the last 120), valued `util`, as a driver does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#define OK 0
#define E_UNINIT 1
#define E_INVALID 2
#define E_NOT_SUPPORTED 3
#define E_NOT_FOUND 6
#define E_INSUFFICIENT 7
#define E_DRIVER 9
#define E_LOST 15
#define MAX_DEV 64
#define MAX_MIG 8
#define MAX_SAMPLES 512
#define MAX_PROCS 64
#define NO_VALUE (-1LL)

typedef struct { long long v; int err; int present; } field_t;

typedef struct dev {
    char uuid[96];
    char name[96];
    unsigned index;
    int lost;
    int is_mig;
    struct dev *parent;
    field_t mem_total, mem_used, util, power_mw, sm_clock, throttle, temp, sm_util;
    field_t pcie_tx, pcie_rx, pcie_gen, pcie_width, nvlink_tx, nvlink_rx;
    int nvlinks;
    unsigned long long nvlink_reads;
    int samples_mode; /* 0 none, 1 scripted, 2 synthetic */
    long long sample_us;
    int n_samples;
    unsigned long long sample_ts[MAX_SAMPLES];
    unsigned sample_val[MAX_SAMPLES];
    int n_procs;
    int procs_fail;
    unsigned proc_pid[MAX_PROCS];
    unsigned proc_sm[MAX_PROCS];
    unsigned long long proc_ts[MAX_PROCS];
    int mig_max;
    int n_mig;
    struct dev *migs[MAX_MIG];
} dev_t_;

static dev_t_ devices[MAX_DEV];
static dev_t_ migs[MAX_DEV * MAX_MIG];
static int n_devices;
static int n_migs;
static int init_fail;
static int initialised;
static struct timespec loaded_mtime;
static off_t loaded_size = -1;
static char loaded_path[4096];

static void parse_field(field_t *f, const char *value) {
    f->present = 1;
    if (value[0] == 'E') {
        f->err = atoi(value + 1);
    } else {
        f->err = 0;
        f->v = strtoll(value, NULL, 0);
    }
}

static void set_key(dev_t_ *d, const char *key, const char *value) {
    if (!strcmp(key, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", value);
    else if (!strcmp(key, "name")) {
        snprintf(d->name, sizeof d->name, "%s", value);
        for (char *p = d->name; *p; p++) if (*p == '+') *p = ' ';
    }
    else if (!strcmp(key, "mem_total")) parse_field(&d->mem_total, value);
    else if (!strcmp(key, "mem_used")) parse_field(&d->mem_used, value);
    else if (!strcmp(key, "util")) parse_field(&d->util, value);
    else if (!strcmp(key, "power_mw")) parse_field(&d->power_mw, value);
    else if (!strcmp(key, "sm_clock")) parse_field(&d->sm_clock, value);
    else if (!strcmp(key, "throttle")) parse_field(&d->throttle, value);
    else if (!strcmp(key, "temp")) parse_field(&d->temp, value);
    else if (!strcmp(key, "sm_util")) parse_field(&d->sm_util, value);
    else if (!strcmp(key, "pcie_tx")) parse_field(&d->pcie_tx, value);
    else if (!strcmp(key, "pcie_rx")) parse_field(&d->pcie_rx, value);
    else if (!strcmp(key, "pcie_gen")) parse_field(&d->pcie_gen, value);
    else if (!strcmp(key, "pcie_width")) parse_field(&d->pcie_width, value);
    else if (!strcmp(key, "nvlink_tx")) parse_field(&d->nvlink_tx, value);
    else if (!strcmp(key, "nvlink_rx")) parse_field(&d->nvlink_rx, value);
    else if (!strcmp(key, "nvlinks")) d->nvlinks = atoi(value);
    else if (!strcmp(key, "lost")) d->lost = atoi(value);
    else if (!strcmp(key, "mig_max")) d->mig_max = atoi(value);
    else if (!strcmp(key, "sample_us")) d->sample_us = atoll(value);
    else if (!strcmp(key, "samples")) {
        d->samples_mode = !strcmp(value, "scripted") ? 1 : !strcmp(value, "synthetic") ? 2 : 0;
    }
}

static void load_script(void) {
    const char *path = getenv("FAKE_NVML_SCRIPT");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        init_fail = E_DRIVER;
        return;
    }
    if (st.st_size == loaded_size && st.st_mtim.tv_sec == loaded_mtime.tv_sec
        && st.st_mtim.tv_nsec == loaded_mtime.tv_nsec && !strcmp(path, loaded_path)) return;
    FILE *f = fopen(path, "r");
    if (!f) { init_fail = E_DRIVER; return; }
    loaded_size = st.st_size;
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    loaded_mtime = st.st_mtim;
    memset(devices, 0, sizeof devices);
    memset(migs, 0, sizeof migs);
    n_devices = n_migs = init_fail = 0;
    char line[4096];
    dev_t_ *last = NULL;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *save = NULL;
        char *kind = strtok_r(line, " \t\r\n", &save);
        if (!kind) continue;
        dev_t_ *target = NULL;
        long long ts = 0; unsigned val = 0;
        if (!strcmp(kind, "device") && n_devices < MAX_DEV) {
            target = &devices[n_devices];
            target->index = (unsigned)n_devices++;
            target->sample_us = 166667;
            last = target;
        } else if (!strcmp(kind, "mig") && last && last->n_mig < MAX_MIG && n_migs < MAX_DEV * MAX_MIG) {
            target = &migs[n_migs++];
            target->is_mig = 1;
            target->parent = last;
            target->index = (unsigned)last->n_mig;
            last->migs[last->n_mig++] = target;
        }
        char *tok;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0;
            if (!strcmp(kind, "init") && !strcmp(tok, "fail")) init_fail = atoi(eq + 1);
            else if (!strcmp(kind, "procs") && last && !strcmp(tok, "fail")) last->procs_fail = atoi(eq + 1);
            else if (!strcmp(kind, "proc") && last && last->n_procs < MAX_PROCS) {
                int k = last->n_procs;
                if (!strcmp(tok, "pid")) last->proc_pid[k] = (unsigned)atoi(eq + 1);
                else if (!strcmp(tok, "sm")) last->proc_sm[k] = (unsigned)atoi(eq + 1);
                else if (!strcmp(tok, "ts_us")) last->proc_ts[k] = (unsigned long long)atoll(eq + 1);
            } else if (!strcmp(kind, "sample")) {
                if (!strcmp(tok, "ts_us")) ts = atoll(eq + 1);
                else if (!strcmp(tok, "value")) val = (unsigned)atoi(eq + 1);
            } else if (target) set_key(target, tok, eq + 1);
        }
        if (!strcmp(kind, "proc") && last && last->n_procs < MAX_PROCS) last->n_procs++;
        if (!strcmp(kind, "sample") && last && last->n_samples < MAX_SAMPLES) {
            last->sample_ts[last->n_samples] = (unsigned long long)ts;
            last->sample_val[last->n_samples++] = val;
        }
    }
    fclose(f);
}

static int check(void *handle, dev_t_ **out) {
    load_script();
    if (!initialised) return E_UNINIT;
    if (!handle) return E_INVALID;
    dev_t_ *d = handle;
    if (d->lost || (d->parent && d->parent->lost)) return E_LOST;
    *out = d;
    return OK;
}


#define FIELD_GETTER(fn_name, member, ctype, scale)                      \
    int fn_name(void *handle, ctype *out) {                                \
        dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;          \
        if (!d->member.present) return E_NOT_SUPPORTED;                    \
        if (d->member.err) return d->member.err;                           \
        if (!out) return E_INVALID;                                        \
        *out = (ctype)(d->member.v * (scale));                             \
        return OK;                                                         \
    }

FIELD_GETTER(nvmlDeviceGetPowerUsage, power_mw, unsigned, 1)
FIELD_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, throttle, unsigned long long, 1)
FIELD_GETTER(nvmlDeviceGetCurrentClocksEventReasons, throttle, unsigned long long, 1)

int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    load_script();
    if (init_fail) return init_fail;
    initialised = 1;
    return OK;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { initialised = 0; return OK; }

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NOT_FOUND: return "Not Found";
    case E_DRIVER: return "Driver Not Loaded";
    case E_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned length) {
    load_script();
    snprintf(version, length, "%s", "550.00.fake");
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned *count) {
    load_script();
    if (!initialised) return E_UNINIT;
    *count = (unsigned)n_devices;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    load_script();
    if (!initialised) return E_UNINIT;
    if (index >= (unsigned)n_devices) return E_INVALID;
    if (devices[index].lost) return E_LOST;
    *device = &devices[index];
    return OK;
}

static int copy_text(void *handle, char *buf, unsigned length, int want_uuid) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    const char *text = want_uuid ? d->uuid : d->name;
    if (strlen(text) + 1 > length) return E_INSUFFICIENT;
    snprintf(buf, length, "%s", text);
    return OK;
}
int nvmlDeviceGetUUID(void *h, char *buf, unsigned length) { return copy_text(h, buf, length, 1); }
int nvmlDeviceGetName(void *h, char *buf, unsigned length) { return copy_text(h, buf, length, 0); }

int nvmlDeviceGetIndex(void *handle, unsigned *index) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (d->is_mig) return E_NOT_SUPPORTED;
    *index = d->index;
    return OK;
}

typedef struct { unsigned long long total, free, used; } memory_t;

int nvmlDeviceGetMemoryInfo(void *handle, memory_t *mem) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->mem_total.present || !d->mem_used.present) return E_NOT_SUPPORTED;
    if (d->mem_total.err) return d->mem_total.err;
    if (d->mem_used.err) return d->mem_used.err;
    mem->total = (unsigned long long)d->mem_total.v << 20;
    mem->used = (unsigned long long)d->mem_used.v << 20;
    mem->free = mem->total - mem->used;
    return OK;
}

typedef struct { unsigned gpu, memory; } utilization_t;

int nvmlDeviceGetUtilizationRates(void *handle, utilization_t *util) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (d->is_mig || !d->util.present) return E_NOT_SUPPORTED;
    if (d->util.err) return d->util.err;
    util->gpu = (unsigned)d->util.v;
    util->memory = 0;
    return OK;
}

typedef struct { unsigned long long ts; unsigned long long value; } sample_t;

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
}

int nvmlDeviceGetSamples(void *handle, int type, unsigned long long last_seen, int *value_type,
                         unsigned *count, sample_t *samples) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (d->is_mig || d->samples_mode == 0 || type != 1) return E_NOT_SUPPORTED;
    if (d->util.present && d->util.err) return d->util.err;
    *value_type = 1; /* unsigned int */
    unsigned n = 0;
    unsigned long long ts_buf[MAX_SAMPLES];
    unsigned val_buf[MAX_SAMPLES];
    if (d->samples_mode == 1) {
        for (int i = 0; i < d->n_samples; i++) {
            if (d->sample_ts[i] > last_seen) {
                ts_buf[n] = d->sample_ts[i];
                val_buf[n++] = d->sample_val[i];
            }
        }
    } else {
        unsigned long long step = (unsigned long long)(d->sample_us > 0 ? d->sample_us : 166667);
        unsigned long long newest = now_us() / step * step;
        unsigned long long oldest = newest - 119 * step;
        unsigned long long first = last_seen >= oldest ? (last_seen / step + 1) * step : oldest;
        for (unsigned long long t = first; t <= newest && n < 120; t += step) {
            ts_buf[n] = t;
            val_buf[n++] = d->util.present ? (unsigned)d->util.v : 0;
        }
    }
    if (n == 0) return E_NOT_FOUND;
    if (!samples) { *count = n; return OK; }
    if (*count < n) n = *count;
    for (unsigned i = 0; i < n; i++) {
        samples[i].ts = ts_buf[i];
        samples[i].value = val_buf[i];
    }
    *count = n;
    return OK;
}

int nvmlDeviceGetClockInfo(void *handle, int type, unsigned *clock) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (type != 1 || !d->sm_clock.present) return E_NOT_SUPPORTED;
    if (d->sm_clock.err) return d->sm_clock.err;
    *clock = (unsigned)d->sm_clock.v;
    return OK;
}

int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned *temp) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (sensor != 0 || !d->temp.present) return E_NOT_SUPPORTED;
    if (d->temp.err) return d->temp.err;
    *temp = (unsigned)d->temp.v;
    return OK;
}

int nvmlDeviceGetMigMode(void *handle, unsigned *current, unsigned *pending) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->mig_max) return E_NOT_SUPPORTED;
    *current = *pending = 1;
    return OK;
}

int nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned *count) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->mig_max) return E_NOT_SUPPORTED;
    *count = (unsigned)d->mig_max;
    return OK;
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned index, void **mig) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->mig_max) return E_NOT_SUPPORTED;
    if (index >= (unsigned)d->n_mig) return E_NOT_FOUND;
    *mig = d->migs[index];
    return OK;
}

int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *handle, void **parent) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->is_mig) return E_INVALID;
    *parent = d->parent;
    return OK;
}

typedef struct {
    unsigned pid;
    unsigned long long ts;
    unsigned sm, mem, enc, dec;
} proc_sample_t;

int nvmlDeviceGetProcessUtilization(void *handle, proc_sample_t *out, unsigned *count,
                                    unsigned long long last_seen) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (d->is_mig) return E_NOT_SUPPORTED;
    if (d->procs_fail) return d->procs_fail;
    if (!count) return E_INVALID;
    unsigned n = 0;
    proc_sample_t buf[MAX_PROCS];
    unsigned long long now = now_us();
    for (int i = 0; i < d->n_procs; i++) {
        unsigned long long ts = d->proc_ts[i] ? d->proc_ts[i] : now;
        if (ts <= last_seen) continue;
        buf[n].pid = d->proc_pid[i];
        buf[n].ts = ts;
        buf[n].sm = d->proc_sm[i];
        buf[n].mem = buf[n].enc = buf[n].dec = 0;
        n++;
    }
    if (n == 0) return E_NOT_FOUND;
    if (!out || *count < n) { *count = n; return E_INSUFFICIENT; }
    memcpy(out, buf, n * sizeof *buf);
    *count = n;
    return OK;
}

/* GPM (Hopper and later): a sample records its device; metrics between two samples answer
 * the device's scripted sm_util as NVML_GPM_METRIC_SM_UTIL (id 2), nothing else. */
typedef struct { dev_t_ *dev; } gpm_sample_t;
typedef struct { const char *short_name, *long_name, *unit; } gpm_info_t;
typedef struct { unsigned metric_id; int ret; double value; gpm_info_t info; } gpm_metric_t;
typedef struct {
    unsigned version;
    unsigned num_metrics;
    gpm_sample_t *sample1, *sample2;
    gpm_metric_t metrics[477];
} gpm_get_t;
typedef struct { unsigned version; unsigned supported; } gpm_support_t;

int nvmlGpmQueryDeviceSupport(void *handle, gpm_support_t *support) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    support->supported = d->sm_util.present && !d->is_mig ? 1 : 0;
    return OK;
}

int nvmlGpmSampleAlloc(gpm_sample_t **out) {
    *out = calloc(1, sizeof **out);
    return *out ? OK : E_INSUFFICIENT;
}

int nvmlGpmSampleFree(gpm_sample_t *sample) {
    free(sample);
    return OK;
}

int nvmlGpmSampleGet(void *handle, gpm_sample_t *sample) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!d->sm_util.present) return E_NOT_SUPPORTED;
    sample->dev = d;
    return OK;
}

int nvmlGpmMetricsGet(gpm_get_t *get) {
    if (!get->sample1 || !get->sample2 || !get->sample2->dev) return E_INVALID;
    dev_t_ *d = get->sample2->dev;
    for (unsigned i = 0; i < get->num_metrics && i < 477; i++) {
        gpm_metric_t *m = &get->metrics[i];
        if (m->metric_id != 2) { m->ret = E_NOT_SUPPORTED; continue; }
        m->ret = d->sm_util.err ? d->sm_util.err : OK;
        m->value = (double)d->sm_util.v;
    }
    return OK;
}

FIELD_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen, unsigned, 1)
FIELD_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width, unsigned, 1)

int nvmlDeviceGetPcieThroughput(void *handle, int counter, unsigned *value) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    field_t *f = counter == 0 ? &d->pcie_tx : counter == 1 ? &d->pcie_rx : NULL;
    if (!f) return E_INVALID;
    if (!f->present) return E_NOT_SUPPORTED;
    if (f->err) return f->err;
    *value = (unsigned)f->v;
    return OK;
}

/* Field values: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138) / _RX (139) per link (scopeId
 * below `nvlinks`), a counter in KiB growing by nvlink_tx/rx KiB at each call. */
typedef struct {
    unsigned field_id, scope_id;
    long long timestamp, latency_us;
    int value_type, ret;
    unsigned long long value;
} field_value_t;

int nvmlDeviceGetFieldValues(void *handle, int count, field_value_t *values) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    unsigned long long now = now_us();
    d->nvlink_reads++;
    for (int i = 0; i < count; i++) {
        field_value_t *v = &values[i];
        field_t *f = v->field_id == 138 ? &d->nvlink_tx : v->field_id == 139 ? &d->nvlink_rx : NULL;
        v->timestamp = (long long)now;
        v->latency_us = 0;
        if (!f || !f->present || (int)v->scope_id >= d->nvlinks) { v->ret = E_NOT_SUPPORTED; continue; }
        if (f->err) { v->ret = f->err; continue; }
        v->ret = OK;
        v->value_type = 3;
        v->value = (unsigned long long)f->v * d->nvlink_reads;
    }
    return OK;
}

typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_info_t;

int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned *count, proc_info_t *out) {
    dev_t_ *d; int rc = check(handle, &d); if (rc) return rc;
    if (!count) return E_INVALID;
    unsigned n = (unsigned)d->n_procs;
    if (n == 0) { *count = 0; return OK; }
    if (!out || *count < n) { *count = n; return E_INSUFFICIENT; }
    for (unsigned i = 0; i < n; i++) {
        out[i].pid = d->proc_pid[i];
        out[i].used = 1ULL << 20;
        out[i].gi = out[i].ci = 0xFFFFFFFFu;
    }
    *count = n;
    return OK;
}
