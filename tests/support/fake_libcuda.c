/* A no-op CUDA driver (libcuda) for tests and benchmarks, loaded by hipsched's real ctypes binding
 * through HIPSCHED_CUDA_LIBRARY (tests/support/fake_libcuda.py builds and installs it).
 *
 * It is C, not Python, so that a benchmark measures hipsched's own host time with every driver call
 * returning at once, and so that a compiled call path can take the entry points' addresses from the
 * library as it would from the real libcuda. Device memory is host memory (copies and memsets work);
 * kernels do not run, a launch is counted. The driver's rules that cost a compare are kept, so a
 * binding that breaks them fails here as it would on a GPU:
 *   - every call but cuGetErrorName/cuGetErrorString/cuDriverGetVersion needs cuInit first;
 *   - after fork() in a process that called cuInit, every call answers CUDA_ERROR_NOT_INITIALIZED;
 *   - the current context is per thread, and allocation, copies, streams, events, modules and launches
 *     need one (CUDA_ERROR_INVALID_CONTEXT);
 *   - a function launches only in the context its module was loaded in (CUDA_ERROR_INVALID_HANDLE).
 *
 * Environment, read at each cuInit: FAKE_LIBCUDA_VERSION (driver version, default 13000),
 * FAKE_LIBCUDA_DEVICES (device count, default 1). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef struct fake_module *CUmodule;
typedef struct fake_function *CUfunction;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef struct fake_pool *CUmemoryPool;

#define EXPORT __attribute__((visibility("default")))

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_DEINITIALIZED = 4, CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_IMAGE = 200, CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209, CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600, CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719, CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_UNKNOWN = 999
};

#define MAX_DEVICES 64
#define MAX_MODULES 1024
#define MAX_FUNCTIONS 8192
#define MEM_ALIGN 256              /* what cuMemAlloc guarantees; kernels' vector loads rely on it */
#define CTX_STACK_DEPTH 32

/* ------------------------------------------------------------------ state */
enum { STATE_UNINIT = 0, STATE_READY = 1, STATE_FORKED = 2 };
static int state = STATE_UNINIT;
static int driver_version = 13000;
static int device_count = 1;

struct fake_ctx { int device; };
struct fake_pool { int device; unsigned long long release_threshold; };
struct fake_module { int in_use; CUcontext ctx; };
struct fake_function { int in_use; CUmodule module; char *name; };
struct fake_stream { unsigned flags; };
struct fake_event { unsigned flags; int recorded; };

static struct fake_ctx contexts[MAX_DEVICES];
static struct fake_pool pools[MAX_DEVICES];
/* Modules and functions live in fixed tables, not on the heap, so that a stale or foreign handle is
 * refused by a range check (CUDA_ERROR_INVALID_HANDLE) instead of being dereferenced. */
static struct fake_module modules[MAX_MODULES];
static struct fake_function functions[MAX_FUNCTIONS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread CUcontext current;
static __thread CUcontext ctx_stack[CTX_STACK_DEPTH];
static __thread int ctx_depth;

static long long launches;
static CUfunction last_function;

static int ready(void) { return __atomic_load_n(&state, __ATOMIC_RELAXED) == STATE_READY; }

#define NEED_INIT() do { if (!ready()) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (!current) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

static void after_fork_in_child(void)
{
    /* The real driver's state does not survive fork(): the child must not use the parent's. */
    __atomic_store_n(&state, STATE_FORKED, __ATOMIC_RELAXED);
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    table_lock = fresh;   /* another thread may have held it at the fork */
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

static int env_int(const char *name, int fallback, int lo, int hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return fallback;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi)
        return fallback;
    return (int)v;
}

static int valid_device(CUdevice dev) { return dev >= 0 && dev < device_count; }

/* ------------------------------------------------------------------ init, versions, errors */
EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Only a process that initialised the driver leaves its children without one, as with the real one. */
    pthread_once(&atfork_once, register_atfork);
    if (__atomic_load_n(&state, __ATOMIC_RELAXED) == STATE_FORKED)
        return CUDA_ERROR_NOT_INITIALIZED;
    driver_version = env_int("FAKE_LIBCUDA_VERSION", 13000, 1000, 1000000);
    device_count = env_int("FAKE_LIBCUDA_DEVICES", 1, 0, MAX_DEVICES);
    for (int i = 0; i < MAX_DEVICES; i++) {
        contexts[i].device = i;
        pools[i].device = i;
    }
    __atomic_store_n(&state, STATE_READY, __ATOMIC_RELAXED);
    return device_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (__atomic_load_n(&state, __ATOMIC_RELAXED) == STATE_FORKED)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    /* answers before cuInit too, as the real one does */
    *version = ready() ? driver_version : env_int("FAKE_LIBCUDA_VERSION", 13000, 1000, 1000000);
    return CUDA_SUCCESS;
}

static const struct { CUresult code; const char *name; const char *text; } error_table[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult code, const char **out, int text)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; i++) {
        if (error_table[i].code == code) {
            *out = text ? error_table[i].text : error_table[i].name;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* A table lookup: works before cuInit and after fork, as the real one does. */
EXPORT CUresult cuGetErrorName(CUresult code, const char **name) { return error_lookup(code, name, 0); }
EXPORT CUresult cuGetErrorString(CUresult code, const char **text) { return error_lookup(code, text, 1); }

/* ------------------------------------------------------------------ devices */
EXPORT CUresult cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    NEED_INIT();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA Device");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    NEED_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    /* An H100-like device; attributes the tests or the package might ask about, 0 for the rest. */
    switch (attribute) {
    case 1: *value = 1024; break;            /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: *value = 1024; break;    /* MAX_BLOCK_DIM_X, _Y */
    case 4: *value = 64; break;              /* MAX_BLOCK_DIM_Z */
    case 5: *value = 2147483647; break;      /* MAX_GRID_DIM_X */
    case 6: case 7: *value = 65535; break;   /* MAX_GRID_DIM_Y, _Z */
    case 8: *value = 49152; break;           /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: *value = 32; break;             /* WARP_SIZE */
    case 12: *value = 65536; break;          /* MAX_REGISTERS_PER_BLOCK */
    case 16: *value = 132; break;            /* MULTIPROCESSOR_COUNT */
    case 39: *value = 2048; break;           /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 41: *value = 1; break;              /* UNIFIED_ADDRESSING */
    case 75: *value = 9; break;              /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; break;              /* COMPUTE_CAPABILITY_MINOR */
    case 81: *value = 233472; break;         /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 97: *value = 232448; break;         /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 115: *value = 1; break;             /* MEMORY_POOLS_SUPPORTED */
    default:
        if (attribute <= 0 || attribute > 200)
            return CUDA_ERROR_INVALID_VALUE;
        *value = 0;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    NEED_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    NEED_INIT();
    return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return cuDevicePrimaryCtxRelease(dev); }

static int valid_ctx(CUcontext ctx) { return ctx >= contexts && ctx < contexts + device_count; }

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    NEED_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx && !valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = current;
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    NEED_INIT();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx)
        *ctx = current;
    current = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
EXPORT CUresult cuCtxPopCurrent(CUcontext *ctx) { return cuCtxPopCurrent_v2(ctx); }

EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    NEED_CTX();
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = (size_t)64 << 30;
    *total_bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */
static CUresult host_alloc(CUdeviceptr *ptr, size_t bytes)
{
    if (!ptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes > SIZE_MAX - MEM_ALIGN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* C11's aligned_alloc wants a multiple of the alignment */
    size_t n = (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
    void *p = aligned_alloc(MEM_ALIGN, n);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes)
{
    NEED_CTX();
    return host_alloc(ptr, bytes);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    NEED_CTX();
    free((void *)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

/* Page-locked host memory (the call path's staging buffers): plain host memory here. */
EXPORT CUresult cuMemAllocHost_v2(void **ptr, size_t bytes)
{
    CUdeviceptr p = 0;
    CUresult status;
    NEED_CTX();
    status = host_alloc(&p, bytes);
    *ptr = (void *)(uintptr_t)p;
    return status;
}

EXPORT CUresult cuMemFreeHost(void *ptr)
{
    NEED_CTX();
    free(ptr);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    return host_alloc(ptr, bytes);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    free((void *)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    if (bytes && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes)
        memcpy((void *)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    if (bytes && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes)
        memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    if (bytes && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes)   /* memmove: the driver allows overlapping device-to-device copies */
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    if (count && !dst)
        return CUDA_ERROR_INVALID_VALUE;
    if (count)
        memset((void *)(uintptr_t)dst, value, count);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    NEED_INIT();
    if (!data || !ptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute != 9)   /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, the one the binding asks */
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)data = 0;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ stream-ordered allocation */
static int valid_pool(CUmemoryPool pool) { return pool >= pools && pool < pools + device_count; }

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    NEED_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = &pools[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void *value)
{
    NEED_INIT();
    if (!valid_pool(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == 4)   /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: a cuuint64_t */
        pool->release_threshold = *(unsigned long long *)value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    (void)keep;
    NEED_INIT();
    return valid_pool(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ streams and events */
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    NEED_CTX();
    if (!stream)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *s = malloc(sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->flags = flags;
    *stream = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    NEED_CTX();
    if (!stream)   /* the default stream is not destroyed */
        return CUDA_ERROR_INVALID_HANDLE;
    free(stream);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    (void)stream;
    NEED_CTX();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    (void)stream;
    (void)flags;
    NEED_CTX();
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    NEED_CTX();
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *e = malloc(sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    e->recorded = 0;
    *event = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    NEED_CTX();
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    (void)stream;
    NEED_CTX();
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    __atomic_store_n(&event->recorded, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent event)
{
    NEED_CTX();
    /* kernels do not run here: whatever an event waits for is done */
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventSynchronize(CUevent event)
{
    NEED_CTX();
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    NEED_CTX();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!start || !end)
        return CUDA_ERROR_INVALID_HANDLE;
    /* as the driver answers for an event never recorded */
    if (!__atomic_load_n(&start->recorded, __ATOMIC_RELAXED) || !__atomic_load_n(&end->recorded, __ATOMIC_RELAXED))
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = 0.001f;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ modules and launches */
static int valid_module(CUmodule m)
{
    return m >= modules && m < modules + MAX_MODULES && __atomic_load_n(&m->in_use, __ATOMIC_ACQUIRE);
}

static int valid_function(CUfunction f)
{
    return f >= functions && f < functions + MAX_FUNCTIONS && __atomic_load_n(&f->in_use, __ATOMIC_ACQUIRE);
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    NEED_CTX();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_MODULES; i++) {
        if (!modules[i].in_use) {
            modules[i].ctx = current;
            __atomic_store_n(&modules[i].in_use, 1, __ATOMIC_RELEASE);
            *module = &modules[i];
            status = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return status;
}

EXPORT CUresult cuModuleUnload(CUmodule module)
{
    NEED_CTX();
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&table_lock);
    if (valid_module(module)) {
        for (int i = 0; i < MAX_FUNCTIONS; i++) {
            if (functions[i].in_use && functions[i].module == module) {
                __atomic_store_n(&functions[i].in_use, 0, __ATOMIC_RELEASE);
                free(functions[i].name);
                functions[i].name = NULL;
                functions[i].module = NULL;
            }
        }
        __atomic_store_n(&module->in_use, 0, __ATOMIC_RELEASE);
        status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&table_lock);
    return status;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    NEED_CTX();
    if (!function || !name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&table_lock);
    if (valid_module(module)) {
        int free_slot = -1;
        status = CUDA_ERROR_OUT_OF_MEMORY;
        /* one handle per (module, name), as the driver gives the same CUfunction each time */
        for (int i = 0; i < MAX_FUNCTIONS; i++) {
            if (functions[i].in_use && functions[i].module == module && strcmp(functions[i].name, name) == 0) {
                *function = &functions[i];
                status = CUDA_SUCCESS;
                break;
            }
            if (free_slot < 0 && !functions[i].in_use)
                free_slot = i;
        }
        if (status != CUDA_SUCCESS && free_slot >= 0) {
            size_t n = strlen(name) + 1;
            char *copy = malloc(n);
            if (copy) {
                memcpy(copy, name, n);
                functions[free_slot].name = copy;
                functions[free_slot].module = module;
                __atomic_store_n(&functions[free_slot].in_use, 1, __ATOMIC_RELEASE);
                *function = &functions[free_slot];
                status = CUDA_SUCCESS;
            }
        }
    }
    pthread_mutex_unlock(&table_lock);
    return status;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridX, unsigned int gridY, unsigned int gridZ,
                               unsigned int blockX, unsigned int blockY, unsigned int blockZ,
                               unsigned int sharedBytes, CUstream stream, void **params, void **extra)
{
    (void)stream;
    NEED_CTX();
    if (!valid_function(f))
        return CUDA_ERROR_INVALID_HANDLE;
    CUmodule module = f->module;   /* once: a racing cuModuleUnload clears it */
    if (!module || module->ctx != current)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gridX || !gridY || !gridZ || !blockX || !blockY || !blockZ || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)blockX * blockY * blockZ > 1024 || blockZ > 64 || gridY > 65535 || gridZ > 65535
        || sharedBytes > 232448)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&last_function, f, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ for the tests */
EXPORT long long fake_libcuda_launches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

EXPORT void *fake_libcuda_last_function(void) { return __atomic_load_n(&last_function, __ATOMIC_RELAXED); }

/* The kernel name cuModuleGetFunction was given for `f`, or NULL for a handle that is not a live one. */
EXPORT const char *fake_libcuda_function_name(void *f)
{
    const char *name = NULL;
    pthread_mutex_lock(&table_lock);
    if (valid_function((CUfunction)f))
        name = ((CUfunction)f)->name;
    pthread_mutex_unlock(&table_lock);
    return name;
}

EXPORT void fake_libcuda_reset(void)
{
    __atomic_store_n(&launches, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&last_function, NULL, __ATOMIC_RELAXED);
}
