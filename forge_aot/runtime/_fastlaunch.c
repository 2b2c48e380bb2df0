/* forge-aot launch fast path: kernel[grid](...) from Python to cuLaunchKernel in one C call.
 *
 * Compiled by `forge-aot build` into <package>/_runtime/_fastlaunch.abi3.so with the CPython limited API
 * (Py_LIMITED_API 0x03090000: one binary for every CPython >= 3.9) and no CUDA, torch or libc-math headers:
 * the few driver types are declared here and the driver entry points are handed over as addresses taken from
 * the ctypes libcuda the runtime already loaded. Optional: without it (no compiler at build time, a .so that
 * does not load, FORGE_NO_C_LAUNCH=1) the pure-Python path runs, and it runs here too for every call this file
 * does not handle (see fastpath.py for what is handled). Every such call is handed, untouched, to
 * Kernel.run, so errors and rare cases behave exactly as in the Python path.
 *
 * Types:
 *   KernelBase  base class of the runtime's Kernel: `kernel[grid]` returns a Launch (mp_subscript in C).
 *   Launch      `kernel[grid]`; calling it tries the FastKernel, else calls kernel.run(grid, args, kwargs).
 *   FastKernel  per kernel handle: how to read a call's arguments and a cache from (dtypes, device, key
 *               values, specialization) to the Launcher and config the Python path resolved for them; for a
 *               kernel with @triton.heuristics, a config pre-hook or host tensor descriptors, to the config and,
 *               per (heuristic values, descriptor block shapes), the Launcher (the heuristics and the pre-hook
 *               are called here on the arguments by name, as Kernel.run calls them, once per call).
 *   Launcher    one loaded binary on one device: parameter-block layout (tensor descriptors as Triton 3.6 lays
 *               them out, their tensor maps encoded here), launch dimensions, driver calls.
 *   Driver      the driver calls of a first launch (device queries, module load) without ctypes (cuda.py).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03090000
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the parameter block is packed little-endian"
#endif

/* 64-bit integers read through the C long functions: CPython's PyLong_As(Unsigned)LongLong convert any int of more
 * than one digit (every device address) through _PyLong_AsByteArray, several times slower than the digit loop of
 * PyLong_As(Unsigned)Long, which is as wide on the LP64 systems this extension is built for. */
#if !defined(__LP64__)
#error "the C launch path assumes LP64 (a C long of 64 bits)"
#endif
#define as_i64(o) ((long long)PyLong_AsLong(o))
#define as_u64(o) ((unsigned long long)PyLong_AsUnsignedLong(o))

#define MAX_ARGS 64
#define MAX_OFFSETS 256              /* parameter-block slots: a tensor descriptor takes several */
#define MAX_RANK 5                   /* of a tensor descriptor, as CUtensorMap's */
#define DESC_CACHE 8                 /* tensor maps remembered per descriptor parameter of a Launcher */
#define MAX_TYPEVARS 8
#define MAX_KEYS 8
#define MAX_CALLS 16
#define MAX_PARAMS (MAX_ARGS + MAX_CALLS)
#define MAX_BLOCK 4096
#define MAX_CACHED 4096
#define MAX_PTRS 24

typedef int CUresult;
typedef CUresult (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, void *stream, void **params, void **extra);
/* cuLaunchKernelEx's types (cuda.h, CUDA 12): a launch with attributes (PDL, cooperative grid). */
typedef struct { int id; char pad[4]; union { char pad[64]; int value; uint64_t align; } v; } LaunchAttribute;
typedef struct {
    unsigned grid[3], block[3], shared;
    void *stream;
    LaunchAttribute *attrs;
    unsigned n_attrs;
} LaunchConfig;
_Static_assert(sizeof(LaunchAttribute) == 72 && sizeof(LaunchConfig) == 56, "CUlaunchAttribute/CUlaunchConfig layout");
typedef CUresult (*launch_ex_fn)(const LaunchConfig *config, void *f, void **params, void **extra);
enum { ATTR_PDL = 1, ATTR_COOPERATIVE = 2 };   /* tables.LAUNCH_ATTR_* */
typedef CUresult (*ctx_get_fn)(void **ctx);
typedef CUresult (*ctx_push_fn)(void *ctx);
typedef CUresult (*ctx_pop_fn)(void **ctx);
/* cuTensorMapEncodeTiled (cuda.h, CUDA 12): a host-side tensor descriptor's CUtensorMap (128 bytes, 64-aligned). */
typedef CUresult (*encode_fn)(void *map, int dtype, unsigned rank, void *address, const uint64_t *dims,
                              const uint64_t *strides, const uint32_t *box, const uint32_t *elem_strides,
                              int interleave, int swizzle, int l2_promotion, int oob_fill);

/* Argument kinds (fastpath.KINDS gives the same numbers). K_DESC: a host-side tensor descriptor
 * (triton.tools.tensor_descriptor.TensorDescriptor), laid out as several parameters (see DescLayout). */
enum { K_PTR = 0, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_FP16, K_BF16, K_FP32, K_FP64, K_DESC,
       K_COUNT };
static const int kind_size[K_COUNT] = {8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 0};
static const long long kind_lo[K_COUNT] = {0, -128, -32768, -2147483647LL - 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const long long kind_hi[K_COUNT] = {0, 127, 32767, 2147483647LL, 0, 255, 65535, 4294967295LL, 0, 0, 0, 0, 0,
                                           0};

static PyTypeObject *KernelBaseType, *LaunchType, *FastKernelType, *LauncherType;
static PyObject *str_run, *str_skip, *str_dtype, *str_named_args, *str_base, *str_block_shape, *str_shape,
    *str_strides, *str_padding, *str_data_ptr, *str_pre_hooks;

/* ---------------------------------------------------------------------------------------------------------
 * Scalars, encoded exactly as the Python path's struct formats do (see packing.py). Each returns 1 when the
 * value was encoded and 0 when this file leaves the value to the Python path (no exception left set).
 */

static int as_double(PyObject *o, double *d) {
    if (!PyFloat_Check(o) && !PyLong_Check(o)) return 0;
    *d = PyFloat_AsDouble(o);
    if (*d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    return 1;
}

static uint64_t double_bits(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }

/* struct.pack('<f', d): round to nearest even; finite values that round to infinity overflow. */
static int pack_fp32(double d, uint32_t *out) {
    uint64_t b = double_bits(d);
    if (((b >> 52) & 0x7ff) == 0x7ff && (b & 0xfffffffffffffULL)) return 0; /* NaN: payload rules vary */
    float f = (float)d;
    uint32_t fb; memcpy(&fb, &f, 4);
    if (((fb >> 23) & 0xff) == 0xff && ((b >> 52) & 0x7ff) != 0x7ff) return 0; /* overflow */
    *out = fb;
    return 1;
}

static uint64_t round_shift(uint64_t m, int shift) { /* round(m / 2**shift), ties to even; 0 < shift < 64 */
    uint64_t q = m >> shift, rem = m & ((1ULL << shift) - 1), half = 1ULL << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

/* struct.pack('<e', d) (CPython's PyFloat_Pack2): rounded once, from the double, ties to even. */
static int pack_fp16(double d, uint16_t *out) {
    uint64_t b = double_bits(d);
    uint16_t sign = (uint16_t)((b >> 63) << 15);
    int e = (int)((b >> 52) & 0x7ff);
    uint64_t m = b & 0xfffffffffffffULL;
    if (e == 0x7ff) {
        if (m) return 0;                          /* NaN */
        *out = sign | 0x7c00; return 1;           /* infinity */
    }
    if (e == 0) { *out = sign; return 1; }        /* zero, or a double subnormal: far below half's range */
    int E = e - 1023;
    if (E >= 16) return 0;                        /* overflow */
    if (E < -25) { *out = sign; return 1; }       /* underflow to zero */
    if (E < -14) {                                /* half subnormal: value / 2**-24, rounded */
        uint64_t q = round_shift(m | (1ULL << 52), 28 - E);
        *out = sign | (uint16_t)q; return 1;      /* q == 1024 is the smallest normal, same encoding */
    }
    uint64_t q = round_shift(m, 42);
    int eh = E + 15;
    if (q == 1024) { q = 0; eh++; if (eh == 31) return 0; }
    *out = sign | (uint16_t)(eh << 10) | (uint16_t)q;
    return 1;
}

/* packing._pack_bf16: the float32 bits, rounded to the upper 16 with ties to even. */
static int pack_bf16(double d, uint16_t *out) {
    uint32_t bits;
    if (!pack_fp32(d, &bits)) return 0;
    uint64_t x = bits;
    *out = (uint16_t)(((x + 0x7fff + ((x >> 16) & 1)) >> 16) & 0xffff);
    return 1;
}

static int convert_scalar(int kind, PyObject *o, uint64_t *out) {
    double d;
    switch (kind) {
    case K_I8: case K_I16: case K_I32: case K_I64: case K_U8: case K_U16: case K_U32: {
        if (!PyLong_Check(o)) return 0;
        long long v = as_i64(o);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (kind != K_I64 && (v < kind_lo[kind] || v > kind_hi[kind])) return 0;
        *out = (uint64_t)v;
        return 1;
    }
    case K_U64: {
        if (!PyLong_Check(o)) return 0;
        unsigned long long v = as_u64(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        *out = v;
        return 1;
    }
    case K_FP16: { uint16_t h; if (!as_double(o, &d) || !pack_fp16(d, &h)) return 0; *out = h; return 1; }
    case K_BF16: { uint16_t h; if (!as_double(o, &d) || !pack_bf16(d, &h)) return 0; *out = h; return 1; }
    case K_FP32: { uint32_t f; if (!as_double(o, &d) || !pack_fp32(d, &f)) return 0; *out = f; return 1; }
    case K_FP64: if (!as_double(o, &d)) return 0; *out = double_bits(d); return 1;
    case K_PTR: {
        if (!PyLong_Check(o)) return 0;
        unsigned long long v = as_u64(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        *out = v;
        return 1;
    }
    }
    return 0;
}

static int read_int_tuple(PyObject *t, int *out, int max, int *n) {
    if (!PyTuple_Check(t)) { PyErr_SetString(PyExc_TypeError, "expected a tuple of ints"); return -1; }
    Py_ssize_t len = PyTuple_Size(t);
    if (len > max) { PyErr_SetString(PyExc_ValueError, "too many entries for the C launch path"); return -1; }
    for (Py_ssize_t i = 0; i < len; i++) {
        long v = PyLong_AsLong(PyTuple_GetItem(t, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        out[i] = (int)v;
    }
    *n = (int)len;
    return 0;
}

static int read_kinds(PyObject *b, unsigned char *out, int n) {
    char *data; Py_ssize_t len;
    if (PyBytes_AsStringAndSize(b, &data, &len) < 0) return -1;
    if (len != n) { PyErr_SetString(PyExc_ValueError, "kinds and positions differ in length"); return -1; }
    for (int i = 0; i < n; i++) {
        if ((unsigned char)data[i] >= K_COUNT) { PyErr_SetString(PyExc_ValueError, "unknown argument kind"); return -1; }
        out[i] = (unsigned char)data[i];
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Launcher: one binary on one device.
 */

/* A tensor descriptor parameter's layout, as Triton 3.6's launcher lays it out (runtime/descriptors.py,
 * param_codes): with TMA the CUtensorMap (128 bytes, 64-aligned), the shape (i32) and the strides (i64); without,
 * the base pointer, the shape and strides (i64), the NaN-padding flag (i8), the shape (i32), the strides (i64).
 * The maps encoded last are remembered: a map depends only on the tensor's address, shape, strides and padding
 * (the binary fixes the rest), and calls that reuse their buffers skip the driver's encoding, as the Python
 * path's descriptors.expander does. */
typedef struct {
    uint64_t addr;
    long long shape[MAX_RANK], strides[MAX_RANK];
    int nan;
    unsigned char map[128];
} MapEntry;

typedef struct {
    int tma, rank;
    int elem_size, elem_type, swizzle, fp4_padded;   /* TMA: the binary's tensordesc metadata */
    uint32_t box[MAX_RANK];                          /* TMA: block size, innermost first (the driver's order) */
    int n_cached, next;
    MapEntry cache[DESC_CACHE];
} DescLayout;

static int desc_slots(const DescLayout *d) { return d->tma ? 1 + 2 * d->rank : 2 + 4 * d->rank; }

typedef struct {
    PyObject_HEAD
    void *function, *ctx;
    launch_fn launch;
    launch_ex_fn launch_ex;          /* set where attrs is: launches with attributes */
    int attrs;                       /* ATTR_* bits */
    ctx_get_fn ctx_get;
    ctx_push_fn ctx_push;
    ctx_pop_fn ctx_pop;
    encode_fn encode;                /* set where a descriptor parameter takes a tensor map */
    unsigned block, shared;
    int n_kept;                      /* kept runtime arguments (those specialized to 1 are compiled in) */
    int idx[MAX_ARGS];               /* their runtime positions */
    unsigned char kind[MAX_ARGS];
    int first[MAX_ARGS];             /* each kept argument's first slot in offset[] */
    DescLayout *desc[MAX_ARGS];      /* the layout of each descriptor argument (NULL for the others) */
    int n_off;
    int offset[MAX_OFFSETS];         /* byte offsets of the parameter slots, then the two scratch pointers */
    int size;                        /* parameter block size */
    long long global_scratch, profile_scratch;
    PyObject *scratch;               /* scratch(size, programs) -> (keep-alive, aligned address) */
    PyObject *stream;                /* stream(device) -> raw stream address (torch's current stream) */
    PyObject *device;                /* int */
    PyObject *check;                 /* check(code, what): raises the runtime's DriverError */
    PyObject *name;                  /* kernel function name, for messages */
    PyObject *result;                /* what kernel[grid](...) returns for a launch of this binary (fastpath.Launched,
                                      * set by the Python path's first launch of it), or NULL: None */
} Launcher;

static void Launcher_dealloc(PyObject *self) {
    Launcher *L = (Launcher *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(L->scratch); Py_XDECREF(L->stream); Py_XDECREF(L->device); Py_XDECREF(L->check);
    Py_XDECREF(L->name); Py_XDECREF(L->result);
    for (int j = 0; j < MAX_ARGS; j++) PyMem_Free(L->desc[j]);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* descs[j] for a descriptor argument: (tma, rank, elem_size, elem_type, box, swizzle, fp4_padded), the box innermost
 * first (descriptors.c_layouts); 0 read, -1 error. */
static int read_desc_layout(PyObject *spec, DescLayout *d) {
    PyObject *box;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "iiiiOii", &d->tma, &d->rank, &d->elem_size, &d->elem_type,
                                                  &box, &d->swizzle, &d->fp4_padded)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a descriptor layout is a tuple");
        return -1;
    }
    if (d->rank < 1 || d->rank > MAX_RANK) {
        PyErr_SetString(PyExc_ValueError, "tensor descriptor rank beyond the C launch path's limits");
        return -1;
    }
    if (d->tma) {
        int box_vals[MAX_RANK], n_box = 0;
        if (read_int_tuple(box, box_vals, MAX_RANK, &n_box) < 0) return -1;
        if (n_box != d->rank || d->elem_size <= 0) {
            PyErr_SetString(PyExc_ValueError, "tensor map box and rank differ");
            return -1;
        }
        for (int i = 0; i < n_box; i++) d->box[i] = (uint32_t)box_vals[i];
    }
    return 0;
}

static PyObject *Launcher_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"function", "ctx", "block", "shared", "positions", "kinds", "offsets", "size",
                            "global_scratch", "profile_scratch", "scratch", "stream", "device", "check", "name",
                            "launch", "ctx_get", "ctx_push", "ctx_pop", "attrs", "launch_ex", "descs", "tensor_map",
                            NULL};
    unsigned long long function, ctx, launch, get, push, pop, launch_ex = 0, tensor_map = 0;
    unsigned block, shared;
    PyObject *positions, *kinds, *offsets, *scratch, *stream, *device, *check, *name, *descs = NULL;
    int size, attrs = 0;
    long long gs, ps;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKIIOOOiLLOOOOUKKKK|iKOK", names, &function, &ctx, &block, &shared,
                                     &positions, &kinds, &offsets, &size, &gs, &ps, &scratch, &stream, &device,
                                     &check, &name, &launch, &get, &push, &pop, &attrs, &launch_ex, &descs,
                                     &tensor_map))
        return NULL;
    if (attrs & ~(ATTR_PDL | ATTR_COOPERATIVE) || (attrs && !launch_ex)) {
        PyErr_SetString(PyExc_ValueError, "launch attributes need cuLaunchKernelEx");   /* Python path says why */
        return NULL;
    }
    Launcher *L = (Launcher *)PyType_GenericAlloc(type, 0);
    if (!L) return NULL;
    if (read_int_tuple(positions, L->idx, MAX_ARGS, &L->n_kept) < 0 || read_kinds(kinds, L->kind, L->n_kept) < 0
        || read_int_tuple(offsets, L->offset, MAX_OFFSETS, &L->n_off) < 0)
        goto fail;
    if (descs == Py_None) descs = NULL;
    if (descs && (!PyTuple_Check(descs) || PyTuple_Size(descs) != L->n_kept)) {
        PyErr_SetString(PyExc_ValueError, "one descriptor layout (or None) per kept argument");
        goto fail;
    }
    /* Each kept argument's slots, and the width of each slot: a scalar one; a descriptor its layout's. */
    int width[MAX_OFFSETS], need = 0;
    for (int j = 0; j < L->n_kept; j++) {
        /* Positions index the call's values (at most MAX_ARGS of them): a kernel with more runtime arguments,
         * some specialized to 1 and dropped, keeps positions beyond that; such a binary launches through ctypes. */
        if (L->idx[j] < 0 || L->idx[j] >= MAX_ARGS) {
            PyErr_SetString(PyExc_ValueError, "argument position beyond the C launch path's limit");
            goto fail;
        }
        L->first[j] = need;
        if (L->kind[j] != K_DESC) {
            if (need < MAX_OFFSETS) width[need] = kind_size[L->kind[j]];
            need++;
            continue;
        }
        PyObject *spec = descs ? PyTuple_GetItem(descs, j) : NULL;
        DescLayout *d = L->desc[j] = PyMem_Calloc(1, sizeof(DescLayout));
        if (!d) { PyErr_NoMemory(); goto fail; }
        if (!spec || spec == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a descriptor argument needs its layout");
            goto fail;
        }
        if (read_desc_layout(spec, d) < 0) goto fail;
        if (d->tma && !tensor_map) {
            PyErr_SetString(PyExc_ValueError, "tensor maps need cuTensorMapEncodeTiled");
            goto fail;
        }
        int r = d->rank, n = desc_slots(d);
        for (int s = 0; s < n && need + s < MAX_OFFSETS; s++) {
            if (d->tma) width[need + s] = s == 0 ? 128 : s <= r ? 4 : 8;
            else width[need + s] = s == 0 ? 8 : s <= 2 * r ? 8 : s == 2 * r + 1 ? 1 : s <= 3 * r + 1 ? 4 : 8;
        }
        need += n;
    }
    if (need + 2 > MAX_OFFSETS || L->n_off != need + 2 || size <= 0 || size > MAX_BLOCK) {
        PyErr_SetString(PyExc_ValueError, "parameter layout does not fit the C launch path");
        goto fail;
    }
    width[need] = width[need + 1] = 8;
    for (int j = 0; j < L->n_off; j++) {
        if (L->offset[j] < 0 || L->offset[j] + width[j] > size || (width[j] == 128 && L->offset[j] % 64)) {
            PyErr_SetString(PyExc_ValueError, "parameter offset outside the block");
            goto fail;
        }
    }
    if (!launch || !get || !push || !pop || !PyCallable_Check(stream) || !PyCallable_Check(check)
        || ((gs || ps) && !PyCallable_Check(scratch))) {
        PyErr_SetString(PyExc_ValueError, "missing driver entry point or callback");
        goto fail;
    }
    L->function = (void *)(uintptr_t)function;
    L->ctx = (void *)(uintptr_t)ctx;
    L->launch = (launch_fn)(uintptr_t)launch;
    L->launch_ex = (launch_ex_fn)(uintptr_t)launch_ex;
    L->encode = (encode_fn)(uintptr_t)tensor_map;
    L->attrs = attrs;
    L->ctx_get = (ctx_get_fn)(uintptr_t)get;
    L->ctx_push = (ctx_push_fn)(uintptr_t)push;
    L->ctx_pop = (ctx_pop_fn)(uintptr_t)pop;
    L->block = block;
    L->shared = shared;
    L->size = size;
    L->global_scratch = gs;
    L->profile_scratch = ps;
    Py_INCREF(scratch); L->scratch = scratch;
    Py_INCREF(stream); L->stream = stream;
    Py_INCREF(device); L->device = device;
    Py_INCREF(check); L->check = check;
    Py_INCREF(name); L->name = name;
    return (PyObject *)L;
fail:
    Py_DECREF(L);
    return NULL;
}

static int call_check(Launcher *L, int code, PyObject *what) {
    if (!what) return -1;
    PyObject *c = PyLong_FromLong(code);
    PyObject *r = c ? PyObject_CallFunctionObjArgs(L->check, c, what, NULL) : NULL;
    Py_XDECREF(c);
    Py_DECREF(what);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* A descriptor's shape or strides (attr), exactly `rank` integers as int() reads them: 0, or -1 with an error. */
static int read_extent(PyObject *desc, PyObject *attr, int rank, long long *out) {
    PyObject *seq = PyObject_GetAttr(desc, attr);
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Size(seq);
    int rc = -1;
    if (n < 0) goto done;
    if (n != rank) {
        PyErr_Format(PyExc_ValueError, "TensorDescriptor: %S of rank %zd, and the binary takes rank %d", attr, n,
                     rank);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) goto done;
        PyObject *as_int = PyNumber_Long(item);   /* int(d), as descriptors.expand reads them */
        Py_DECREF(item);
        if (!as_int) goto done;
        out[i] = as_i64(as_int);
        Py_DECREF(as_int);
        if (out[i] == -1 && PyErr_Occurred()) goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static int put_i32(unsigned char *at, long long v) {
    if (v < kind_lo[K_I32] || v > kind_hi[K_I32]) {
        PyErr_Format(PyExc_OverflowError, "TensorDescriptor: %lld does not fit i32", v);
        return -1;
    }
    int32_t x = (int32_t)v;
    memcpy(at, &x, 4);
    return 0;
}

/* The tensor map of a descriptor, remembered or encoded (the driver's cuTensorMapEncodeTiled, with the arguments
 * of Triton's fill_tma_descriptor and cuda.py's encode_tensor_map): 0, or -1 with an exception set. */
static int tensor_map(Launcher *L, DescLayout *d, uint64_t addr, const long long *shape, const long long *strides,
                      int nan, unsigned char *out) {
    int r = d->rank;
    for (int c = 0; c < d->n_cached; c++) {
        MapEntry *m = &d->cache[c];
        if (m->addr == addr && m->nan == nan && !memcmp(m->shape, shape, sizeof(long long) * (size_t)r)
            && !memcmp(m->strides, strides, sizeof(long long) * (size_t)r)) {
            memcpy(out, m->map, 128);
            return 0;
        }
    }
    uint64_t dims[MAX_RANK], byte_strides[MAX_RANK];
    uint32_t elem_strides[MAX_RANK] = {1, 1, 1, 1, 1};
    unsigned char map[128] __attribute__((aligned(64)));
    for (int i = 0; i < r; i++) dims[i] = (uint64_t)shape[r - 1 - i];
    for (int i = 0; i < r - 1; i++) byte_strides[i] = (uint64_t)(strides[r - 2 - i] * d->elem_size);
    int code = d->tma ? L->encode(map, d->elem_type, (unsigned)r, (void *)(uintptr_t)addr, dims, byte_strides, d->box,
                                  elem_strides, 0, d->swizzle, 2, nan) : 0;
    if (code) {
        PyObject *shp = PyList_New(r), *box = PyList_New(r);
        PyObject *what = NULL;
        if (shp && box) {
            for (int i = 0; i < r; i++) {
                PyList_SetItem(shp, i, PyLong_FromLongLong(shape[i]));
                PyList_SetItem(box, i, PyLong_FromUnsignedLong(d->box[r - 1 - i]));
            }
            what = PyUnicode_FromFormat("cuTensorMapEncodeTiled (element type %d, rank %d, address %p, shape %R, "
                                        "box %R, swizzle %d)", d->elem_type, r, (void *)(uintptr_t)addr, shp, box,
                                        d->swizzle);
        }
        Py_XDECREF(shp); Py_XDECREF(box);
        if (call_check(L, code, what) == 0) PyErr_SetString(PyExc_RuntimeError, "cuTensorMapEncodeTiled failed");
        return -1;
    }
    MapEntry *m = &d->cache[d->next];
    d->next = (d->next + 1) % DESC_CACHE;
    if (d->n_cached < DESC_CACHE) d->n_cached++;
    m->addr = addr;
    m->nan = nan;
    memcpy(m->shape, shape, sizeof(long long) * (size_t)r);
    memcpy(m->strides, strides, sizeof(long long) * (size_t)r);
    memcpy(m->map, map, 128);
    memcpy(out, map, 128);
    return 0;
}

/* One descriptor argument into its slots (descriptors.expand): 0, or -1 with the exception the Python path
 * raises for the same descriptor. */
static int pack_desc(Launcher *L, int j, PyObject *desc, unsigned char *buf) {
    DescLayout *d = L->desc[j];
    const int *off = &L->offset[L->first[j]];
    int r = d->rank;
    long long shape[MAX_RANK], strides[MAX_RANK];
    if (!desc) { PyErr_SetString(PyExc_TypeError, "a tensor descriptor argument is missing"); return -1; }
    if (read_extent(desc, str_shape, r, shape) < 0 || read_extent(desc, str_strides, r, strides) < 0) return -1;
    PyObject *padding = PyObject_GetAttr(desc, str_padding);
    if (!padding) return -1;
    int nan = PyUnicode_Check(padding) && PyUnicode_CompareWithASCIIString(padding, "nan") == 0;
    Py_DECREF(padding);
    PyObject *base = PyObject_GetAttr(desc, str_base);
    PyObject *ptr = base ? PyObject_CallMethodObjArgs(base, str_data_ptr, NULL) : NULL;
    Py_XDECREF(base);
    if (!ptr) return -1;
    uint64_t addr = as_u64(ptr);
    Py_DECREF(ptr);
    if (addr == (uint64_t)-1 && PyErr_Occurred()) return -1;
    if (!d->tma) {   /* base pointer, shape and strides (i64), NaN flag, shape (i32), strides (i64) */
        memcpy(buf + off[0], &addr, 8);
        for (int i = 0; i < r; i++) {
            memcpy(buf + off[1 + i], &shape[i], 8);
            memcpy(buf + off[1 + r + i], &strides[i], 8);
            if (put_i32(buf + off[2 + 2 * r + i], shape[i]) < 0) return -1;
            memcpy(buf + off[2 + 3 * r + i], &strides[i], 8);
        }
        buf[off[1 + 2 * r]] = (unsigned char)nan;
        return 0;
    }
    if (strides[r - 1] != 1) {
        PyErr_SetString(PyExc_ValueError, "TensorDescriptor: the last dimension must be contiguous");
        return -1;
    }
    if (d->fp4_padded) shape[r - 1] *= 2;
    if (tensor_map(L, d, addr, shape, strides, nan, buf + off[0]) < 0) return -1;
    for (int i = 0; i < r; i++) {   /* the shape (i32) and strides (i64) */
        if (put_i32(buf + off[1 + i], shape[i]) < 0) return -1;
        memcpy(buf + off[1 + r + i], &strides[i], 8);
    }
    return 0;
}

/* Fill the parameter block from the converted runtime values and, for descriptor arguments, the descriptors
 * themselves (scratch pointers left zero): 0, or -1 with an exception set. */
static int pack_block(Launcher *L, const uint64_t *vals, PyObject *const *objs, unsigned char *buf) {
    memset(buf, 0, (size_t)L->size);
    for (int j = 0; j < L->n_kept; j++) {
        if (L->kind[j] == K_DESC) {
            if (pack_desc(L, j, objs[L->idx[j]], buf) < 0) return -1;
        } else {
            memcpy(buf + L->offset[L->first[j]], &vals[L->idx[j]], (size_t)kind_size[L->kind[j]]);
        }
    }
    return 0;
}

static int add_scratch(Launcher *L, long long size, unsigned long long programs, unsigned char *slot,
                       PyObject **keep) {
    PyObject *r = PyObject_CallFunction(L->scratch, "LK", size, programs);
    if (!r) return -1;
    if (!PyTuple_Check(r) || PyTuple_Size(r) != 2) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "scratch() must return (buffer, address)");
        return -1;
    }
    unsigned long long addr = as_u64(PyTuple_GetItem(r, 1));
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(r); return -1; }
    memcpy(slot, &addr, 8);
    *keep = r;
    return 0;
}

/* The launch itself, as _BinaryLauncher.__call__: 0 on success, -1 with an exception set. */
static int launcher_launch(Launcher *L, const uint64_t *vals, PyObject *const *objs, unsigned long long gx,
                           unsigned long long gy, unsigned long long gz) {
    unsigned long long programs;
    if (__builtin_mul_overflow(gx, gy, &programs) || __builtin_mul_overflow(programs, gz, &programs)) {
        PyErr_SetString(PyExc_OverflowError, "grid too large");
        return -1;
    }
    if (programs == 0) return 0;
    unsigned char buf[MAX_BLOCK] __attribute__((aligned(64)));   /* a tensor map is 64-byte aligned */
    void *params[MAX_OFFSETS + 1];   /* NULL after the last: the driver never reads it (a test's fake driver does) */
    PyObject *keep1 = NULL, *keep2 = NULL;
    int rc = -1;
    if (pack_block(L, vals, objs, buf) < 0) return -1;
    if (L->global_scratch && add_scratch(L, L->global_scratch, programs, buf + L->offset[L->n_off - 2], &keep1) < 0)
        goto done;
    if (L->profile_scratch
        && add_scratch(L, L->profile_scratch, programs, buf + L->offset[L->n_off - 1], &keep2) < 0)
        goto done;
    for (int j = 0; j < L->n_off; j++) params[j] = buf + L->offset[j];
    params[L->n_off] = NULL;
    PyObject *s = PyObject_CallFunctionObjArgs(L->stream, L->device, NULL);
    if (!s) goto done;
    void *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (!stream && PyErr_Occurred()) goto done;
    int code, push_code = 0, pop_code = 0, pushed = 0;
    PyThreadState *ts = PyEval_SaveThread();
    void *current = NULL;
    L->ctx_get(&current);
    if (current != L->ctx) {
        /* This thread runs under another context (another device, or none yet): launch under ours. */
        push_code = L->ctx_push(L->ctx);
        pushed = 1;
    }
    if (push_code == 0) {
        if (L->attrs) {
            /* As Triton's launcher: programmatic stream serialization, then cooperative, each with the value 1. */
            LaunchAttribute attr[2];
            unsigned n_attrs = 0;
            memset(attr, 0, sizeof(attr));
            if (L->attrs & ATTR_PDL) { attr[n_attrs].id = 6; attr[n_attrs++].v.value = 1; }
            if (L->attrs & ATTR_COOPERATIVE) { attr[n_attrs].id = 2; attr[n_attrs++].v.value = 1; }
            LaunchConfig config = {{(unsigned)gx, (unsigned)gy, (unsigned)gz}, {L->block, 1, 1}, L->shared, stream,
                                   attr, n_attrs};
            code = L->launch_ex(&config, L->function, params, NULL);
        } else {
            code = L->launch(L->function, (unsigned)gx, (unsigned)gy, (unsigned)gz, L->block, 1, 1, L->shared,
                             stream, params, NULL);
        }
        if (pushed) { void *popped = NULL; pop_code = L->ctx_pop(&popped); }
    } else {
        code = 0;
    }
    PyEval_RestoreThread(ts);
    if (push_code) { rc = call_check(L, push_code, PyUnicode_FromString("cuCtxPushCurrent")); goto done; }
    if (pop_code && call_check(L, pop_code, PyUnicode_FromString("cuCtxPopCurrent")) < 0) goto done;
    if (code) {
        rc = call_check(L, code, PyUnicode_FromFormat("launch of %U (grid %llux%llux%llu, block %u)", L->name, gx,
                                                      gy, gz, L->block));
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(keep1);
    Py_XDECREF(keep2);
    return rc;
}

/* Reads launch dimensions from a tuple or list of ints: 1 read, 0 not handled here. */
static int read_grid(PyObject *g, unsigned long long dims[3]) {
    Py_ssize_t n;
    if (PyTuple_Check(g)) n = PyTuple_Size(g);
    else if (PyList_Check(g)) n = PyList_Size(g);
    else return 0;
    if (n < 1) return 0;
    for (int i = 0; i < 3; i++) {
        if (i >= n) { dims[i] = 1; continue; }
        PyObject *item = PyTuple_Check(g) ? PyTuple_GetItem(g, i) : PyList_GetItem(g, i);
        if (!PyLong_Check(item)) return 0;
        long long v = as_i64(item);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (v < 0 || v > 0xffffffffLL) return 0;
        dims[i] = (unsigned long long)v;
    }
    return 1;
}

/* The values of the kept arguments from a sequence (`seq`, held by the caller while they are used: descriptor
 * arguments are kept as the objects themselves, borrowed): 1 converted, 0 left to the Python path. */
static int convert_values(Launcher *L, PyObject *seq, uint64_t *vals, PyObject **objs) {
    Py_ssize_t n = PySequence_Size(seq);
    int ok = 1;
    for (int j = 0; j < L->n_kept && ok; j++) {
        if (L->idx[j] >= n) { ok = 0; break; }
        PyObject *v = PySequence_GetItem(seq, L->idx[j]);
        if (!v) { PyErr_Clear(); ok = 0; break; }
        if (L->kind[j] == K_DESC) objs[L->idx[j]] = v;   /* seq holds it */
        else ok = convert_scalar(L->kind[j], v, &vals[L->idx[j]]);
        Py_DECREF(v);
    }
    return ok;
}

/* launcher(grid, values): the same call as _BinaryLauncher(grid, values) (pointers given as addresses, tensor
 * descriptors as themselves). */
static PyObject *Launcher_call(PyObject *self, PyObject *args, PyObject *kw) {
    Launcher *L = (Launcher *)self;
    if (kw && PyDict_Size(kw)) { PyErr_SetString(PyExc_TypeError, "launcher(grid, values) takes no keywords"); return NULL; }
    PyObject *grid, *values;
    unsigned long long dims[3];
    uint64_t vals[MAX_ARGS] = {0};
    PyObject *objs[MAX_ARGS] = {0};
    if (!PyArg_ParseTuple(args, "OO", &grid, &values)) return NULL;
    if (!read_grid(grid, dims)) { PyErr_SetString(PyExc_TypeError, "grid must be a tuple of 1 to 3 ints"); return NULL; }
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    if (!seq) return NULL;
    int r = convert_values(L, seq, vals, objs);
    if (r && launcher_launch(L, vals, objs, dims[0], dims[1], dims[2]) < 0) r = -1;
    Py_DECREF(seq);
    if (r < 0) return NULL;
    if (!r) { PyErr_SetString(PyExc_ValueError, "values the C launch path leaves to the Python path"); return NULL; }
    Py_RETURN_NONE;
}

/* launcher.pack(values): the parameter block (scratch pointers zero) as bytes, or None if not packed here. */
static PyObject *Launcher_pack(PyObject *self, PyObject *values) {
    Launcher *L = (Launcher *)self;
    uint64_t vals[MAX_ARGS] = {0};
    PyObject *objs[MAX_ARGS] = {0};
    unsigned char buf[MAX_BLOCK] __attribute__((aligned(64)));
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    if (!seq) return NULL;
    PyObject *out = NULL;
    int r = convert_values(L, seq, vals, objs);
    if (!r) { Py_INCREF(Py_None); out = Py_None; }
    else if (pack_block(L, vals, objs, buf) == 0) out = PyBytes_FromStringAndSize((const char *)buf, L->size);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef Launcher_methods[] = {
    {"pack", Launcher_pack, METH_O, "The parameter block for runtime values (pointers as addresses), or None."},
    {NULL, NULL, 0, NULL},
};

static PyObject *launcher_result(PyObject *launcher);

static PyObject *Launcher_get_result(PyObject *self, void *closure) {
    (void)closure;
    return launcher_result(self);
}

static int Launcher_set_result(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    Launcher *L = (Launcher *)self;
    PyObject *old = L->result;
    Py_XINCREF(value);
    L->result = value == Py_None ? NULL : value;
    if (value == Py_None) Py_DECREF(value);
    Py_XDECREF(old);
    return 0;
}

/* A result returned as a new reference (None where unset): what a fast launch through this launcher returns. */
static PyObject *launcher_result(PyObject *launcher) {
    PyObject *r = ((Launcher *)launcher)->result ? ((Launcher *)launcher)->result : Py_None;
    Py_INCREF(r);
    return r;
}

static PyGetSetDef Launcher_getset[] = {
    {"result", Launcher_get_result, Launcher_set_result, "What a launch of this binary returns (or None).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Launcher_slots[] = {
    {Py_tp_new, Launcher_new},
    {Py_tp_dealloc, Launcher_dealloc},
    {Py_tp_call, Launcher_call},
    {Py_tp_methods, Launcher_methods},
    {Py_tp_getset, Launcher_getset},
    {Py_tp_doc, "One loaded binary on one device, launched from C."},
    {0, NULL},
};
static PyType_Spec Launcher_spec = {"_fastlaunch.Launcher", sizeof(Launcher), 0, Py_TPFLAGS_DEFAULT, Launcher_slots};

/* ---------------------------------------------------------------------------------------------------------
 * FastKernel: reading a call, and the cache of resolved launches.
 */
typedef struct {
    PyObject *dtypes[MAX_TYPEVARS];   /* owned by the entry (or, in a CallKey, by the call) */
    PyObject *ptypes[MAX_PTRS];       /* each pointer (or descriptor) argument's dtype, None where it is None:
                                       * compared, not hashed (owned by the entry; borrowed in a CallKey: torch's
                                       * dtype singletons) */
    PyObject *calls[MAX_CALLS];       /* call-site values (borrowed in a CallKey, owned by the entry) */
    uint32_t defaulted;               /* bit c: calls[c] is the default (the call did not pass it); not hashed */
    long device;
    uint64_t keys[MAX_KEYS];
    uint64_t descs;                   /* bit per argument position: a tensor descriptor */
    char spec[MAX_ARGS];
    uint64_t hash;
} CallKey;

/* A resolved (dtypes, device, key values, call-site values, specialization): the config, and either the binary's
 * Launcher (plain kernels) or, where more is resolved per call (heuristics, a config pre-hook, tensor descriptors:
 * a "late" entry), the Launcher per (heuristic values, descriptor block shapes), the config's pre-hook by name
 * (looked up in kernel.pre_hooks per call, as Kernel.run does) and the Python path's launch from that point on for
 * values not seen yet (`fallback(kernel, grid, args, call, heur)`: BinaryBackend.launch with this entry's state and
 * config; it holds no kernel). */
typedef struct {
    PyObject *launcher, *meta, *config, *call;
    PyObject *kwargs;            /* config.all_kwargs() where heuristics or the pre-hook read the arguments by name */
    PyObject *late;              /* late entries: dict (heuristic values, block shapes...) -> Launcher; else NULL */
    PyObject *pre_hook, *fallback;   /* late entries: the pre-hook's name (or NULL), the Python path's launch */
} Resolved;

typedef struct {
    int used;
    CallKey key;
    Resolved r;
} Entry;

typedef struct {
    PyObject_HEAD
    int n;
    unsigned char kinds[MAX_ARGS];
    int n_ptr, ptr_pos[MAX_ARGS];   /* pointer and descriptor arguments: what has a device and a dtype */
    int ptr_index[MAX_ARGS];   /* argument position -> its index among the pointers (ptypes), -1 for others */
    int n_spec, spec_pos[MAX_ARGS];
    unsigned char spec_is_ptr[MAX_ARGS];
    uint64_t spec_scalars;   /* bit per argument position: a specialized scalar, which a call may pass as None */
    uint64_t ptr_ints;       /* bit per argument position: a pointer parameter that also takes an integer */
    uint64_t written;        /* bit per argument position: a pointer or descriptor the kernel may write through */
    unsigned char ptr_int_kind[MAX_ARGS];   /* ... and that integer's kind (K_I32 or K_I64) */
    int n_tv, tv_pos[MAX_TYPEVARS];
    int tv_next[MAX_ARGS];   /* the next argument of the same type variable, or -1: read where this one is None */
    int n_param;             /* the kernel's parameters, in order: what a call's positional arguments stand for */
    int param_slot[MAX_PARAMS];   /* runtime index (< n), n + call-site name index, or -1 (tuned or heuristic:
                                   * never passed, the Python path says so) */
    int n_lead;              /* how many leading parameters are the runtime arguments in order (n: runtime first) */
    int n_key, key_pos[MAX_KEYS];
    int n_call;
    PyObject *call_names, *call_defaults, *missing;   /* call-site names, their defaults (or `missing`) */
    PyObject *ignored;   /* launch options a call may pass at their default, as Kernel._bind drops them (a dict) */
    PyObject *tensor_types, *get_device, *data_ptr, *launches;
    int n_heur;
    PyObject *runtime_names, *heuristics, *heuristic_names;   /* (name, function) pairs in calling order */
    Entry *table;
    size_t cap, used;
    PyObject *last;          /* the Launcher of this kernel's last C launch (kernel.best_config), or NULL */
} FastKernel;

/* Remembers the launcher a C launch ran (a reference: the cache may drop its entry). */
static void set_last(FastKernel *F, PyObject *launcher) {
    PyObject *old = F->last;
    if (old == launcher) return;   /* (the common case: the same binary again, no reference to move) */
    Py_INCREF(launcher);
    F->last = launcher;
    Py_XDECREF(old);
}

static int pointer_like(int kind) { return kind == K_PTR || kind == K_DESC; }

/* Every reference a cache entry holds, each given to DO: releasing an entry and the collector's visit list the same
 * ones (a reference missing from the visit would keep a cycle through the kernel handle alive). */
#define ENTRY_REFS(F, e, DO) do {                                                               \
        for (int t_ = 0; t_ < (F)->n_tv; t_++) DO((e)->key.dtypes[t_]);                      \
        for (int i_ = 0; i_ < (F)->n_ptr; i_++) DO((e)->key.ptypes[i_]);                     \
        for (int c_ = 0; c_ < (F)->n_call; c_++) DO((e)->key.calls[c_]);                     \
        DO((e)->r.launcher); DO((e)->r.meta); DO((e)->r.config); DO((e)->r.call);            \
        DO((e)->r.kwargs); DO((e)->r.late); DO((e)->r.pre_hook); DO((e)->r.fallback);        \
    } while (0)

static void release_entry(FastKernel *F, Entry *e) { ENTRY_REFS(F, e, Py_XDECREF); }

/* Empties the cache. The table is detached first: releasing an entry may run arbitrary code (and let other
 * threads call this kernel), which must find a consistent, empty table. */
static void clear_table(FastKernel *F) {
    Entry *old = F->table;
    size_t cap = F->cap;
    F->table = NULL;
    F->cap = 0;
    F->used = 0;
    for (size_t i = 0; i < cap; i++)
        if (old[i].used) release_entry(F, &old[i]);
    PyMem_Free(old);
}

/* The garbage collector sees what a FastKernel holds: a kernel's heuristics (their module's globals), remembered
 * call-site values and launches can lead back to the kernel handle, whose _fast is this object. */
static int FastKernel_traverse(PyObject *self, visitproc visit, void *arg) {
    FastKernel *F = (FastKernel *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(F->tensor_types); Py_VISIT(F->get_device); Py_VISIT(F->data_ptr); Py_VISIT(F->launches);
    Py_VISIT(F->call_names); Py_VISIT(F->call_defaults); Py_VISIT(F->missing); Py_VISIT(F->ignored);
    Py_VISIT(F->runtime_names); Py_VISIT(F->heuristics); Py_VISIT(F->heuristic_names); Py_VISIT(F->last);
    for (size_t i = 0; i < F->cap; i++)
        if (F->table[i].used) ENTRY_REFS(F, &F->table[i], Py_VISIT);
    return 0;
}

static int FastKernel_clear(PyObject *self) {
    FastKernel *F = (FastKernel *)self;
    clear_table(F);
    Py_CLEAR(F->tensor_types); Py_CLEAR(F->get_device); Py_CLEAR(F->data_ptr); Py_CLEAR(F->launches);
    Py_CLEAR(F->call_names); Py_CLEAR(F->call_defaults); Py_CLEAR(F->missing); Py_CLEAR(F->ignored);
    Py_CLEAR(F->runtime_names); Py_CLEAR(F->heuristics); Py_CLEAR(F->heuristic_names); Py_CLEAR(F->last);
    return 0;
}

static void FastKernel_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    FastKernel_clear(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *FastKernel_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"kinds", "ptr_positions", "spec_positions", "spec_pointers", "type_positions",
                            "key_positions", "call_names", "call_defaults", "missing", "tensor_types", "get_device",
                            "data_ptr", "launches", "runtime_names", "heuristics", "heuristic_names", "type_next",
                            "param_slots", "int_pointers", "int_pointer_kinds", "written", "ignored", NULL};
    PyObject *kinds, *ptr_pos, *spec_pos, *spec_ptr, *tv_pos, *key_pos, *call_names, *call_defaults, *missing, *types,
        *get_device, *data_ptr, *launches, *runtime_names = NULL, *heuristics = NULL, *heuristic_names = NULL,
        *tv_next = NULL, *param_slots = NULL, *int_ptrs = NULL, *int_ptr_kinds = NULL, *written = NULL,
        *ignored = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO!O!OOOOO|O!O!O!O!O!O!O!O!O!", names, &kinds, &ptr_pos, &spec_pos,
                                     &spec_ptr, &tv_pos, &key_pos, &PyTuple_Type, &call_names, &PyTuple_Type,
                                     &call_defaults, &missing, &types, &get_device, &data_ptr, &launches,
                                     &PyTuple_Type, &runtime_names, &PyTuple_Type, &heuristics, &PyTuple_Type,
                                     &heuristic_names, &PyTuple_Type, &tv_next, &PyTuple_Type, &param_slots,
                                     &PyTuple_Type, &int_ptrs, &PyBytes_Type, &int_ptr_kinds, &PyTuple_Type, &written,
                                     &PyDict_Type, &ignored))
        return NULL;
    FastKernel *F = (FastKernel *)PyType_GenericAlloc(type, 0);
    if (!F) return NULL;
    Py_ssize_t n = PyBytes_Size(kinds);
    int n_sp = 0, sp_flags[MAX_ARGS];
    if (n < 0) goto fail;
    if (n > MAX_ARGS) { PyErr_SetString(PyExc_ValueError, "too many arguments for the C launch path"); goto fail; }
    F->n = (int)n;
    if (read_kinds(kinds, F->kinds, F->n) < 0 || read_int_tuple(ptr_pos, F->ptr_pos, MAX_ARGS, &F->n_ptr) < 0
        || read_int_tuple(spec_pos, F->spec_pos, MAX_ARGS, &F->n_spec) < 0
        || read_int_tuple(spec_ptr, sp_flags, MAX_ARGS, &n_sp) < 0
        || read_int_tuple(tv_pos, F->tv_pos, MAX_TYPEVARS, &F->n_tv) < 0
        || read_int_tuple(key_pos, F->key_pos, MAX_KEYS, &F->n_key) < 0)
        goto fail;
    if (n_sp != F->n_spec) { PyErr_SetString(PyExc_ValueError, "spec positions and flags differ"); goto fail; }
    if (F->n_ptr > MAX_PTRS) { PyErr_SetString(PyExc_ValueError, "too many pointers for the C launch path"); goto fail; }
    for (int i = 0; i < MAX_ARGS; i++) F->tv_next[i] = -1;
    if (tv_next) {
        int n_next = 0;
        if (read_int_tuple(tv_next, F->tv_next, MAX_ARGS, &n_next) < 0) goto fail;
        for (int i = 0; i < n_next; i++)   /* forward only, so a walk along them ends */
            if (F->tv_next[i] != -1
                && (F->tv_next[i] <= i || F->tv_next[i] >= F->n || !pointer_like(F->kinds[F->tv_next[i]]))) {
                PyErr_SetString(PyExc_ValueError, "type_next positions"); goto fail;
            }
    }
    for (int i = 0; i < F->n_spec; i++) F->spec_is_ptr[i] = (unsigned char)(sp_flags[i] != 0);
#define CHECK_POS(arr, count) for (int i = 0; i < (count); i++) if ((arr)[i] < 0 || (arr)[i] >= F->n) { \
        PyErr_SetString(PyExc_ValueError, "argument position out of range"); goto fail; }
    CHECK_POS(F->ptr_pos, F->n_ptr) CHECK_POS(F->spec_pos, F->n_spec) CHECK_POS(F->tv_pos, F->n_tv)
    CHECK_POS(F->key_pos, F->n_key)
#undef CHECK_POS
    for (int i = 0; i < MAX_ARGS; i++) F->ptr_index[i] = -1;
    for (int i = 0; i < F->n_ptr; i++) {
        if (!pointer_like(F->kinds[F->ptr_pos[i]])) { PyErr_SetString(PyExc_ValueError, "pointer kind"); goto fail; }
        F->ptr_index[F->ptr_pos[i]] = i;
    }
    for (int i = 0; i < F->n; i++)
        if (F->kinds[i] == K_DESC && F->ptr_index[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "descriptor arguments are among the pointer positions"); goto fail;
        }
    for (int i = 0; i < F->n_key; i++) {
        int k = F->kinds[F->key_pos[i]];
        if (k < K_I8 || k > K_U64) { PyErr_SetString(PyExc_ValueError, "key arguments must be integers"); goto fail; }
    }
    for (int i = 0; i < F->n_spec; i++) {
        int k = F->kinds[F->spec_pos[i]];
        if ((k == K_PTR) != F->spec_is_ptr[i] || k == K_DESC) {
            PyErr_SetString(PyExc_ValueError, "specialized pointers are pointers"); goto fail;
        }
        if (k != K_PTR) F->spec_scalars |= 1ull << F->spec_pos[i];
    }
    for (int i = 0; i < F->n_tv; i++)
        if (!pointer_like(F->kinds[F->tv_pos[i]])) {
            PyErr_SetString(PyExc_ValueError, "dtype from a tensor"); goto fail;
        }
    if (int_ptrs) {   /* pointer parameters that also take an integer (flash-attn's rotary SEQLEN_OFFSETS) */
        int n_ip = 0, ip_pos[MAX_ARGS];
        unsigned char ip_kind[MAX_ARGS];
        if (!int_ptr_kinds || read_int_tuple(int_ptrs, ip_pos, MAX_ARGS, &n_ip) < 0
            || read_kinds(int_ptr_kinds, ip_kind, n_ip) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "int_pointers needs int_pointer_kinds");
            goto fail;
        }
        for (int i = 0; i < n_ip; i++) {
            if (ip_pos[i] < 0 || ip_pos[i] >= F->n || F->kinds[ip_pos[i]] != K_PTR
                || (ip_kind[i] != K_I32 && ip_kind[i] != K_I64)) {
                PyErr_SetString(PyExc_ValueError, "int_pointers: pointer positions taking i32 or i64"); goto fail;
            }
            F->ptr_ints |= 1ull << ip_pos[i];
            F->ptr_int_kind[ip_pos[i]] = ip_kind[i];
        }
    }
    if (written) {   /* the pointer and descriptor arguments the kernel may write through (guard_allows) */
        int n_w = 0, w_pos[MAX_ARGS];
        if (read_int_tuple(written, w_pos, MAX_ARGS, &n_w) < 0) goto fail;
        for (int i = 0; i < n_w; i++) {
            if (w_pos[i] < 0 || w_pos[i] >= F->n || !pointer_like(F->kinds[w_pos[i]])) {
                PyErr_SetString(PyExc_ValueError, "written: pointer or descriptor positions"); goto fail;
            }
            F->written |= 1ull << w_pos[i];
        }
    }
    if (!PyTuple_Check(types)) { PyErr_SetString(PyExc_TypeError, "tensor_types must be a tuple"); goto fail; }
    if (PyTuple_Size(call_names) > MAX_CALLS || PyTuple_Size(call_names) != PyTuple_Size(call_defaults)) {
        PyErr_SetString(PyExc_ValueError, "call-site names beyond the C launch path's limits"); goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(call_names); i++)
        if (!PyUnicode_Check(PyTuple_GetItem(call_names, i))) {
            PyErr_SetString(PyExc_TypeError, "call-site names are strings"); goto fail;
        }
    F->n_call = (int)PyTuple_Size(call_names);
    if (param_slots) {   /* default: the runtime parameters alone, in order */
        if (read_int_tuple(param_slots, F->param_slot, MAX_PARAMS, &F->n_param) < 0) goto fail;
        for (int i = 0; i < F->n_param; i++)
            if (F->param_slot[i] < -1 || F->param_slot[i] >= F->n + F->n_call) {
                PyErr_SetString(PyExc_ValueError, "param_slots beyond the runtime and call-site names"); goto fail;
            }
    } else {
        F->n_param = F->n;
        for (int i = 0; i < F->n; i++) F->param_slot[i] = i;
    }
    while (F->n_lead < F->n && F->n_lead < F->n_param && F->param_slot[F->n_lead] == F->n_lead) F->n_lead++;
    Py_INCREF(call_names); F->call_names = call_names;
    Py_INCREF(call_defaults); F->call_defaults = call_defaults;
    Py_INCREF(missing); F->missing = missing;
    Py_XINCREF(ignored); F->ignored = ignored;
    Py_INCREF(types); F->tensor_types = types;
    Py_INCREF(get_device); F->get_device = get_device;
    Py_INCREF(data_ptr); F->data_ptr = data_ptr;
    Py_INCREF(launches); F->launches = launches;
    if (runtime_names) {   /* runtime arguments passed by keyword are read by these names */
        if (PyTuple_Size(runtime_names) != F->n) {
            PyErr_SetString(PyExc_ValueError, "one runtime name per runtime argument"); goto fail;
        }
        Py_INCREF(runtime_names); F->runtime_names = runtime_names;
    }
    if (heuristics && PyTuple_Size(heuristics)) {
        /* Every heuristic is a (name, callable) pair; every heuristic parameter gets a value; the arguments
         * are read by name. */
        if (!runtime_names || !heuristic_names) {
            PyErr_SetString(PyExc_ValueError, "heuristics need the runtime names and the heuristic names");
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PyTuple_Size(heuristics); i++) {
            PyObject *pair = PyTuple_GetItem(heuristics, i);
            if (!PyTuple_Check(pair) || PyTuple_Size(pair) != 2 || !PyUnicode_Check(PyTuple_GetItem(pair, 0))
                || !PyCallable_Check(PyTuple_GetItem(pair, 1))) {
                PyErr_SetString(PyExc_TypeError, "heuristics are (name, callable) pairs");
                goto fail;
            }
        }
        F->n_heur = (int)PyTuple_Size(heuristics);
        Py_INCREF(heuristics); F->heuristics = heuristics;
        Py_INCREF(heuristic_names); F->heuristic_names = heuristic_names;
    }
    return (PyObject *)F;
fail:
    Py_DECREF(F);
    return NULL;
}

static int is_tensor(FastKernel *F, PyObject *o) {
    Py_ssize_t n = PyTuple_Size(F->tensor_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)Py_TYPE(o) == PyTuple_GetItem(F->tensor_types, i)) return 1;
    return 0;
}

static long long call_int(PyObject *fn, PyObject *arg, int *ok) {
    PyObject *r = PyObject_CallFunctionObjArgs(fn, arg, NULL);
    *ok = 0;
    if (!r) { PyErr_Clear(); return 0; }
    long long v = 0;
    if (PyLong_Check(r)) {
        v = as_i64(r);
        if (v == -1 && PyErr_Occurred()) PyErr_Clear(); else *ok = 1;
    }
    Py_DECREF(r);
    return v;
}

static void release_key(FastKernel *F, CallKey *k) {
    for (int t = 0; t < F->n_tv; t++) Py_CLEAR(k->dtypes[t]);
}

/* A tensor argument's dtype (borrowed: torch's dtype singletons live as long as torch) and device: 1 read, 0 not
 * a tensor on a GPU (the Python path says what is wrong). */
static int read_tensor(FastKernel *F, PyObject *a, PyObject **dtype, long *device) {
    int ok;
    if (!is_tensor(F, a)) return 0;
    PyObject *dt = PyObject_GetAttr(a, str_dtype);
    if (!dt) { PyErr_Clear(); return 0; }
    *dtype = dt;
    Py_DECREF(dt);
    long long d = call_int(F->get_device, a, &ok);
    if (!ok || d < 0) return 0;
    *device = (long)d;
    return 1;
}

/* Read a call's arguments as the Python path would: 1 read (the caller releases k), 0 left to the Python path.
 * kwargs: the call's keywords, of which `taken` are runtime arguments already in args (merge_keywords); only
 * call-site constexprs and launch options (each missing one takes its default, as Kernel._bind does) are read
 * here, any other keyword is the Python path's to bind or refuse. objs: each tensor descriptor argument (a
 * `tensordesc<T>` parameter, or a pointer parameter passed one), borrowed from args. */
static int read_call(FastKernel *F, PyObject *args, PyObject *kwargs, Py_ssize_t taken, CallKey *k,
                     uint64_t *vals, PyObject **objs) {
    if (PyTuple_Size(args) != F->n) return 0;
    memset(k, 0, sizeof(*k));
    Py_ssize_t given = kwargs ? PyDict_Size(kwargs) : 0, matched = 0;
    if (given > taken && !F->n_call && !F->ignored) return 0;
    for (int c = 0; c < F->n_call; c++) {
        PyObject *v = given ? PyDict_GetItem(kwargs, PyTuple_GetItem(F->call_names, c)) : NULL;
        if (v) matched++;
        else { v = PyTuple_GetItem(F->call_defaults, c); k->defaulted |= 1u << c; }
        if (v == F->missing) return 0;                /* a required constexpr not passed: Python says so */
        k->calls[c] = v;
    }
    if (matched + taken != given) {
        /* other keywords: launch options at their defaults (the tutorials' num_ctas=1) read as not passed */
        Py_ssize_t pos = 0, extra = 0;
        PyObject *name, *v;
        if (!F->ignored) return 0;
        while (PyDict_Next(kwargs, &pos, &name, &v)) {
            PyObject *d = PyDict_GetItem(F->ignored, name);   /* borrowed */
            if (!d) continue;
            int eq = PyObject_RichCompareBool(v, d, Py_EQ);
            if (eq < 0) { PyErr_Clear(); return 0; }
            if (!eq) return 0;                        /* another value: the Python path reports it */
            extra++;
        }
        if (matched + taken + extra != given) return 0;
    }
    long device = -2;
    uint64_t nones = 0;                               /* pointers passed as None (bit per argument position) */
    uint64_t ints = 0;                                /* pointers passed an integer (bit per argument position) */
    for (int i = 0; i < F->n_ptr; i++) {
        int p = F->ptr_pos[i];
        PyObject *a = PyTuple_GetItem(args, p), *dt = NULL;
        long d = -1;
        objs[p] = NULL;   /* what a Launcher reads there, for a descriptor only */
        if (F->kinds[p] == K_PTR && a == Py_None) { vals[p] = 0; nones |= 1ull << p; k->ptypes[i] = Py_None; continue; }
        if (F->kinds[p] == K_PTR && PyLong_CheckExact(a) && ((F->ptr_ints >> p) & 1)) {
            /* an integer where the kernel also takes one: typed like the manifest's *i32|i32 (out of range: the
             * Python path names the type) */
            if (!convert_scalar(F->ptr_int_kind[p], a, &vals[p])) return 0;
            ints |= 1ull << p;
            k->ptypes[i] = (PyObject *)&PyLong_Type;
            continue;
        }
        if (F->kinds[p] == K_PTR && read_tensor(F, a, &dt, &d)) {
            /* the element type is compiled into the binary: part of the key (Kernel._state checks it on a miss) */
            PyObject *ptr = PyObject_CallFunctionObjArgs(F->data_ptr, a, NULL);
            if (!ptr) { PyErr_Clear(); return 0; }
            int ok = convert_scalar(K_PTR, ptr, &vals[p]);
            Py_DECREF(ptr);
            if (!ok) return 0;
        } else {
            /* A tensor descriptor (a tensordesc<T> parameter; a pointer parameter passed one, as the Triton
             * tutorial's attention does): its tensor's dtype and device, the object itself packed at launch. */
            if (a == Py_None || PyLong_Check(a) || is_tensor(F, a)) return 0;
            PyObject *base = PyObject_GetAttr(a, str_base);
            if (!base) { PyErr_Clear(); return 0; }
            int ok = read_tensor(F, base, &dt, &d);
            Py_DECREF(base);
            if (!ok) return 0;
            vals[p] = 0;
            objs[p] = a;
            k->descs |= 1ull << p;
        }
        k->ptypes[i] = dt;
        if (device == -2) device = d;
        else if (d != device) return 0;               /* tensors on two devices: the Python path says so */
    }
    if (device < 0) return 0;
    k->device = device;
    for (int i = 0; i < F->n; i++) {
        if (pointer_like(F->kinds[i])) continue;
        PyObject *a = PyTuple_GetItem(args, i);
        /* a specialized scalar passed as None (Liger's softcap=None): compiled in as the constant None */
        if (a == Py_None && ((F->spec_scalars >> i) & 1)) { vals[i] = 0; nones |= 1ull << i; continue; }
        if (!convert_scalar(F->kinds[i], a, &vals[i])) return 0;
    }
    for (int t = 0; t < F->n_tv; t++) {
        /* Kernel.axis_values: the type variable's first tensor given; None where all are None (the variant the
         * Python path chose for that, in Kernel.find_variant, is remembered under None) */
        int p = F->tv_pos[t];
        PyObject *a = PyTuple_GetItem(args, p);
        while (a == Py_None && F->tv_next[p] >= 0) { p = F->tv_next[p]; a = PyTuple_GetItem(args, p); }
        /* the dtype the pointer loop read (ptypes), not read again */
        k->dtypes[t] = a == Py_None ? Py_None : k->ptypes[F->ptr_index[p]];
        Py_INCREF(k->dtypes[t]);
    }
    for (int j = 0; j < F->n_key; j++) k->keys[j] = vals[F->key_pos[j]];
    /* tables.argument_spec: D aligned pointer / integer divisible by 16, 1 integer equal to 1, N passed as None,
     * i / d / o an integer passed to a pointer parameter (any, divisible by 16, equal to 1), T a tensor
     * descriptor passed to a pointer parameter, x otherwise (a float always) */
    for (int s = 0; s < F->n_spec; s++) {
        int p = F->spec_pos[s], kind = F->kinds[p];
        uint64_t v = vals[p];
        k->spec[s] = (nones >> p) & 1 ? 'N' : (ints >> p) & 1 ? (v == 1 ? 'o' : ((v & 15) ? 'i' : 'd'))
                   : (k->descs >> p) & 1 ? 'T'
                   : F->spec_is_ptr[s] ? ((v & 15) ? 'x' : 'D')
                   : kind >= K_FP16 ? 'x' : (v == 1 ? '1' : ((v & 15) ? 'x' : 'D'));
    }
    uint64_t h = 1469598103934665603ULL;
#define MIX(x) do { h ^= (uint64_t)(x); h *= 1099511628211ULL; h ^= h >> 29; } while (0)
    for (int t = 0; t < F->n_tv; t++) MIX((uintptr_t)k->dtypes[t]);
    MIX(device);
    MIX(k->descs);
    for (int j = 0; j < F->n_key; j++) MIX(k->keys[j]);
    for (int c = 0; c < F->n_call; c++) {
        Py_hash_t ch = PyObject_Hash(k->calls[c]);
        if (ch == -1 && PyErr_Occurred()) { PyErr_Clear(); release_key(F, k); return 0; }
        MIX(ch);
    }
    for (int s = 0; s < F->n_spec; s++) MIX(k->spec[s]);
#undef MIX
    k->hash = h;
    return 1;
}

static int same_key(FastKernel *F, const CallKey *a, const CallKey *b) {
    if (a->hash != b->hash || a->device != b->device || a->descs != b->descs) return 0;
    for (int t = 0; t < F->n_tv; t++) if (a->dtypes[t] != b->dtypes[t]) return 0;
    for (int i = 0; i < F->n_ptr; i++) if (a->ptypes[i] != b->ptypes[i]) return 0;
    for (int j = 0; j < F->n_key; j++) if (a->keys[j] != b->keys[j]) return 0;
    if (memcmp(a->spec, b->spec, (size_t)F->n_spec) != 0) return 0;
    for (int c = 0; c < F->n_call; c++) {
        if (a->calls[c] == b->calls[c]) continue;
        int eq = PyObject_RichCompareBool(a->calls[c], b->calls[c], Py_EQ);   /* as the Python path's dicts */
        if (eq < 0) PyErr_Clear();
        if (eq != 1) return 0;
    }
    return 1;
}

static Entry *find(FastKernel *F, const CallKey *k) {
    if (!F->cap) return NULL;
    size_t mask = F->cap - 1;
    for (size_t i = (size_t)k->hash & mask;; i = (i + 1) & mask) {
        Entry *e = &F->table[i];
        if (!e->used) return NULL;
        if (same_key(F, &e->key, k)) return e;
    }
}

static int grow(FastKernel *F) {
    size_t old_cap = F->cap, cap = old_cap ? old_cap * 2 : 16;
    Entry *old = F->table, *table = PyMem_Calloc(cap, sizeof(Entry));
    if (!table) { PyErr_NoMemory(); return -1; }
    F->table = table;
    F->cap = cap;
    F->used = 0;
    for (size_t i = 0; i < old_cap; i++) {   /* moves the references, no counts change */
        if (!old[i].used) continue;
        size_t mask = cap - 1, j = (size_t)old[i].key.hash & mask;
        while (table[j].used) j = (j + 1) & mask;
        table[j] = old[i];
        F->used++;
    }
    PyMem_Free(old);
    return 0;
}

/* The entry for k, inserted if new (late: see Entry); NULL with an exception set on failure. */
static Entry *insert(FastKernel *F, CallKey *k, PyObject *launcher, PyObject *meta, PyObject *config,
                     PyObject *call, PyObject *kwargs, int late, PyObject *pre_hook, PyObject *fallback) {
    Entry *found = find(F, k);
    if (found) return found;
    if (F->used >= MAX_CACHED) {                 /* bounded, like ConfigTable's lookup cache */
        clear_table(F);
        if ((found = find(F, k))) return found;  /* another thread may have run meanwhile */
    }
    PyObject *by_late = NULL;
    if (late && !(by_late = PyDict_New())) return NULL;
    if ((F->used + 1) * 2 > F->cap && grow(F) < 0) { Py_XDECREF(by_late); return NULL; }
    size_t mask = F->cap - 1, i = (size_t)k->hash & mask;
    while (F->table[i].used) i = (i + 1) & mask;
    Entry *e = &F->table[i];
    e->key = *k;
    for (int t = 0; t < F->n_tv; t++) Py_INCREF(e->key.dtypes[t]);
    for (int i = 0; i < F->n_ptr; i++) Py_INCREF(e->key.ptypes[i]);
    for (int c = 0; c < F->n_call; c++) Py_INCREF(e->key.calls[c]);
    Py_INCREF(launcher); e->r.launcher = launcher;
    Py_INCREF(call); e->r.call = call;
    Py_INCREF(meta); e->r.meta = meta;
    Py_INCREF(config); e->r.config = config;
    Py_XINCREF(kwargs); e->r.kwargs = kwargs;
    Py_XINCREF(pre_hook); e->r.pre_hook = pre_hook;
    Py_XINCREF(fallback); e->r.fallback = fallback;
    e->r.late = by_late;
    e->used = 1;
    F->used++;
    return e;
}

/* What picks a late entry's binary, read after its heuristics and pre-hook ran: the heuristic values, or, with
 * tensor descriptors, (heuristic values, then each descriptor's block shape, by argument position). NULL with an
 * exception set where a block shape is unreadable (the Python path raises its own error). */
static PyObject *late_key(FastKernel *F, PyObject *heur, PyObject *args, uint64_t descs) {
    if (!descs) { Py_INCREF(heur); return heur; }   /* the heuristic values alone: no tuple made per call */
    int n_desc = 0;
    for (int p = 0; p < F->n; p++) n_desc += (int)((descs >> p) & 1);
    PyObject *key = PyTuple_New(1 + n_desc);
    if (!key) return NULL;
    Py_INCREF(heur);
    PyTuple_SetItem(key, 0, heur);
    for (int p = 0, at = 1; p < F->n; p++) {
        if (!((descs >> p) & 1)) continue;
        PyObject *shape = PyObject_GetAttr(PyTuple_GetItem(args, p), str_block_shape);
        PyObject *t = shape ? PySequence_Tuple(shape) : NULL;
        Py_XDECREF(shape);
        if (!t) { Py_DECREF(key); return NULL; }
        PyTuple_SetItem(key, at++, t);
    }
    return key;
}

/* fast.register(args, call, launcher, launch_meta, config, spec, heur=(), config_kwargs=None, pre_hook=None,
 * fallback=None) -> bool: remember what the Python path resolved for this call (call: its bound call-site values;
 * heur: the heuristic values it computed; config_kwargs: config.all_kwargs() where heuristics or the pre-hook read
 * the arguments by name; pre_hook: the config's pre-hook name; fallback: the Python path's launch for late values
 * not seen yet), if this file reads the call the same way (same specialization string). A call with heuristics, a config pre-hook or tensor
 * descriptors is remembered under the values that picked its binary after they ran (late_key). */
static PyObject *FastKernel_register(PyObject *self, PyObject *args) {
    FastKernel *F = (FastKernel *)self;
    PyObject *call_args, *call, *launcher, *meta, *config, *heur = NULL, *kwargs = Py_None, *pre_hook = Py_None,
        *fallback = Py_None;
    const char *spec;
    Py_ssize_t spec_len;
    if (!PyArg_ParseTuple(args, "O!O!O!OOs#|O!OOO", &PyTuple_Type, &call_args, &PyDict_Type, &call, LauncherType,
                          &launcher, &meta, &config, &spec, &spec_len, &PyTuple_Type, &heur, &kwargs, &pre_hook,
                          &fallback))
        return NULL;
    if (pre_hook == Py_None) pre_hook = NULL;
    if (fallback == Py_None) fallback = NULL;
    /* Heuristic values (one per heuristic parameter) and the config's keyword arguments come exactly with a
     * kernel read with its heuristics; anything else (a reading made before the heuristics were all added) is
     * not remembered: those calls stay on the Python path. */
    Py_ssize_t n_heur = heur ? PyTuple_Size(heur) : 0;
    Py_ssize_t want = F->n_heur ? PyTuple_Size(F->heuristic_names) : 0;
    if (n_heur != want || ((F->n_heur || pre_hook) && !PyDict_Check(kwargs))
        || (pre_hook && !PyUnicode_Check(pre_hook)))
        Py_RETURN_FALSE;
    CallKey k;
    uint64_t vals[MAX_ARGS];
    PyObject *objs[MAX_ARGS] = {0};
    if (!read_call(F, call_args, call, 0, &k, vals, objs)) Py_RETURN_FALSE;
    int late = F->n_heur || pre_hook || k.descs;
    int ok = spec_len == F->n_spec && memcmp(spec, k.spec, (size_t)F->n_spec) == 0
             && (!late || (fallback && PyCallable_Check(fallback)));
    PyObject *key = NULL;
    if (ok && late) {
        PyObject *empty = heur ? NULL : PyTuple_New(0);
        key = late_key(F, heur ? heur : empty, call_args, k.descs);
        Py_XDECREF(empty);
        if (!key) { PyErr_Clear(); ok = 0; }
    }
    if (ok) {
        Entry *e = insert(F, &k, late ? Py_None : launcher, meta, config, call, late ? kwargs : NULL, late,
                          late ? pre_hook : NULL, late ? fallback : NULL);
        if (!e) { release_key(F, &k); Py_XDECREF(key); return NULL; }
        if (late && e->r.late) {
            PyObject *by_late = e->r.late;   /* held: storing into it may run code that clears the table */
            Py_INCREF(by_late);
            int r = PyDict_Size(by_late) < MAX_CACHED ? PyDict_SetItem(by_late, key, launcher) : 0;
            Py_DECREF(by_late);
            if (r < 0) { release_key(F, &k); Py_DECREF(key); return NULL; }
        }
    }
    Py_XDECREF(key);
    release_key(F, &k);
    return PyBool_FromLong(ok);
}

/* fast.spec(args, kwargs=None) -> str or None: the specialization string this file reads from a call. */
static PyObject *FastKernel_read_spec(PyObject *self, PyObject *args) {
    FastKernel *F = (FastKernel *)self;
    PyObject *call_args, *kwargs = NULL;
    CallKey k;
    uint64_t vals[MAX_ARGS];
    PyObject *objs[MAX_ARGS] = {0};
    if (!PyArg_ParseTuple(args, "O!|O!", &PyTuple_Type, &call_args, &PyDict_Type, &kwargs)) return NULL;
    if (!read_call(F, call_args, kwargs, 0, &k, vals, objs)) Py_RETURN_NONE;
    release_key(F, &k);
    return PyUnicode_FromStringAndSize(k.spec, F->n_spec);
}

static PyObject *FastKernel_forget(PyObject *self, PyObject *unused) {
    (void)unused;
    clear_table((FastKernel *)self);
    Py_RETURN_NONE;
}

static PyObject *FastKernel_size(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(((FastKernel *)self)->used);
}

static PyObject *FastKernel_get_last(PyObject *self, void *closure) {
    (void)closure;
    PyObject *last = ((FastKernel *)self)->last;
    if (!last) Py_RETURN_NONE;
    return launcher_result(last);
}

static int FastKernel_set_last(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    if (value != Py_None) {
        PyErr_SetString(PyExc_TypeError, "last can only be forgotten (set to None)");
        return -1;
    }
    Py_CLEAR(((FastKernel *)self)->last);
    return 0;
}

static PyGetSetDef FastKernel_getset[] = {
    {"last", FastKernel_get_last, FastKernel_set_last,
     "What the last C launch of this kernel returned (its binary's result), or None; set None to forget it.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef FastKernel_methods[] = {
    {"register", FastKernel_register, METH_VARARGS, "Remember the launch the Python path resolved for a call."},
    {"spec", FastKernel_read_spec, METH_VARARGS, "The specialization string read from a call, or None."},
    {"clear", FastKernel_forget, METH_NOARGS, "Forget every remembered launch."},
    {"size", FastKernel_size, METH_NOARGS, "How many launches are remembered."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot FastKernel_slots[] = {
    {Py_tp_new, FastKernel_new},
    {Py_tp_dealloc, FastKernel_dealloc},
    {Py_tp_traverse, FastKernel_traverse},
    {Py_tp_clear, FastKernel_clear},
    {Py_tp_methods, FastKernel_methods},
    {Py_tp_getset, FastKernel_getset},
    {Py_tp_doc, "How to read a kernel's calls, and the launches resolved for them."},
    {0, NULL},
};
static PyType_Spec FastKernel_spec = {"_fastlaunch.FastKernel", sizeof(FastKernel), 0,
                                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, FastKernel_slots};

/* ---------------------------------------------------------------------------------------------------------
 * Launch: kernel[grid].
 */
typedef struct {
    PyObject_HEAD
    PyObject *kernel, *fast, *grid;
} Launch;

static void Launch_dealloc(PyObject *self) {
    Launch *l = (Launch *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(l->kernel); Py_XDECREF(l->fast); Py_XDECREF(l->grid);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* The grid: the tuple given, or what the grid function returns for `meta` (for the arguments by name, `nargs` or
 * Kernel.named_args, where it reads one: a KeyError, as Triton allows). New reference, or NULL with an error. */
static PyObject *grid_value(Launch *l, PyObject *args, PyObject *meta, PyObject *config, PyObject *call,
                            PyObject *nargs) {
    if (!PyCallable_Check(l->grid)) { Py_INCREF(l->grid); return l->grid; }
    PyObject *g = PyObject_CallFunctionObjArgs(l->grid, meta, NULL);
    if (g || !PyErr_ExceptionMatches(PyExc_KeyError)) return g;
    PyErr_Clear();
    PyObject *named = nargs ? (Py_INCREF(nargs), nargs)
                            : PyObject_CallMethodObjArgs(l->kernel, str_named_args, args, call, config, NULL);
    if (!named) return NULL;
    g = PyObject_CallFunctionObjArgs(l->grid, named, NULL);
    Py_DECREF(named);
    return g;
}

/* The grid's dimensions: 1 read, 0 left to the Python path, -1 error (the grid function raised). */
static int eval_grid(Launch *l, PyObject *args, PyObject *meta, PyObject *config, PyObject *call,
                     unsigned long long dims[3]) {
    if (!PyCallable_Check(l->grid)) return read_grid(l->grid, dims);
    PyObject *g = grid_value(l, args, meta, config, call, NULL);
    if (!g) return -1;
    int r = read_grid(g, dims);
    Py_DECREF(g);
    return r;
}

/* After a pre-hook each tensor argument's address is read again, as Kernel.run reads them only then (a hook may
 * give an argument new storage): 1 with the same specialization, 0 where it changed (the Python path launches). */
static int reread_pointers(FastKernel *F, PyObject *args, const CallKey *k, uint64_t *vals) {
    for (int i = 0; i < F->n_ptr; i++) {
        int p = F->ptr_pos[i];
        if (F->kinds[p] != K_PTR || k->ptypes[i] == Py_None || k->ptypes[i] == (PyObject *)&PyLong_Type
            || ((k->descs >> p) & 1))
            continue;
        PyObject *a = PyTuple_GetItem(args, p);
        if (!is_tensor(F, a)) return 0;
        PyObject *ptr = PyObject_CallFunctionObjArgs(F->data_ptr, a, NULL);
        if (!ptr) { PyErr_Clear(); return 0; }
        int ok = convert_scalar(K_PTR, ptr, &vals[p]);
        Py_DECREF(ptr);
        if (!ok) return 0;
    }
    for (int s = 0; s < F->n_spec; s++) {
        char was = k->spec[s];
        if (F->spec_is_ptr[s] && (was == 'D' || was == 'x') && ((vals[F->spec_pos[s]] & 15) ? 'x' : 'D') != was)
            return 0;
    }
    return 1;
}

/* A late entry (see Entry), as Kernel.run: where the kernel has heuristics or the config a pre-hook, the arguments
 * by name (runtime arguments, call-site values, the config's keyword arguments), each heuristic called on them in
 * order and its value added, then the pre-hook; the grid function called on the config's launch values plus the
 * heuristic values (on the arguments by name if it reads one); the binary remembered for the heuristic values and
 * the descriptors' block shapes as the pre-hook left them, launched; values not seen yet launched by the Python
 * path from this point on (`fallback`), which remembers them, so heuristics and pre-hooks run once per call.
 * 1 launched (by the C path or the fallback), -1 error (a heuristic, the pre-hook, the grid function, the launch or
 * the fallback raised: the error the Python path would raise). */
static int late_call(Launch *l, FastKernel *F, PyObject *args, PyObject *call_kwargs, const CallKey *k,
                     const Resolved *e, uint64_t *vals, PyObject *const *objs, PyObject **out) {
    int r = -1, hooks = F->n_heur || e->pre_hook;
    PyObject *nargs = NULL, *heur = NULL, *grid_meta = NULL, *grid = NULL, *key = NULL;
    if (hooks) {
        if (!(nargs = PyDict_New())) return -1;
        for (int i = 0; i < F->n; i++)
            if (PyDict_SetItem(nargs, PyTuple_GetItem(F->runtime_names, i), PyTuple_GetItem(args, i)) < 0) goto done;
        /* This call's call-site values, in the order Kernel._bind gives them: the keywords as passed (read_call
         * let only call-site names through), then the defaults of the ones left out (read_call marked them), in
         * declaration order. */
        if (call_kwargs && PyDict_Size(call_kwargs) && PyDict_Update(nargs, call_kwargs) < 0) goto done;
        for (int c = 0; c < F->n_call; c++)
            if ((k->defaulted >> c & 1u) && PyDict_SetItem(nargs, PyTuple_GetItem(F->call_names, c), k->calls[c]) < 0)
                goto done;
        if (PyDict_Update(nargs, e->kwargs) < 0) goto done;
        for (int j = 0; j < F->n_heur; j++) {
            PyObject *pair = PyTuple_GetItem(F->heuristics, j);
            PyObject *v = PyObject_CallFunctionObjArgs(PyTuple_GetItem(pair, 1), nargs, NULL);
            if (!v) goto done;
            int set = PyDict_SetItem(nargs, PyTuple_GetItem(pair, 0), v);
            Py_DECREF(v);
            if (set < 0) goto done;
        }
    }
    Py_ssize_t n_names = F->n_heur ? PyTuple_Size(F->heuristic_names) : 0;
    /* the grid function's meta: the config's, plus the heuristic values where there are any (a copy then) */
    if (!(heur = PyTuple_New(n_names)) || (n_names && PyCallable_Check(l->grid) && !(grid_meta = PyDict_Copy(e->meta))))
        goto done;
    for (Py_ssize_t j = 0; j < n_names; j++) {
        PyObject *name = PyTuple_GetItem(F->heuristic_names, j);
        PyObject *v = PyDict_GetItemWithError(nargs, name);
        if (!v) {   /* a heuristic parameter no heuristic set: Kernel.heuristic_values' KeyError */
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
            goto done;
        }
        Py_INCREF(v);
        PyTuple_SetItem(heur, j, v);
        if (grid_meta && PyDict_SetItem(grid_meta, name, v) < 0) goto done;
    }
    int same = 1;
    if (e->pre_hook) {   /* kernel.pre_hooks[name](nargs), looked up per call as Kernel.run does */
        PyObject *table = PyObject_GetAttr(l->kernel, str_pre_hooks);
        PyObject *hook = table ? PyObject_GetItem(table, e->pre_hook) : NULL;
        Py_XDECREF(table);
        PyObject *ran = hook ? PyObject_CallFunctionObjArgs(hook, nargs, NULL) : NULL;
        Py_XDECREF(hook);
        if (!ran) goto done;
        Py_DECREF(ran);
        same = reread_pointers(F, args, k, vals);
    }
    if (!(grid = grid_value(l, args, grid_meta ? grid_meta : e->meta, e->config, e->call, nargs))) goto done;
    unsigned long long dims[3];
    PyObject *launcher = NULL;
    if (same && read_grid(grid, dims)) {
        key = late_key(F, heur, args, k->descs);
        if (!key) PyErr_Clear();   /* the Python path raises its own error for it */
        else if (!(launcher = PyDict_GetItemWithError(e->late, key)) && PyErr_Occurred()) goto done;
    }
    if (launcher) {
        Py_INCREF(launcher);
        r = launcher_launch((Launcher *)launcher, vals, objs, dims[0], dims[1], dims[2]) < 0 ? -1 : 1;
        if (r == 1) { *out = launcher_result(launcher); set_last(F, launcher); }
        Py_DECREF(launcher);
    } else {
        PyObject *done = PyObject_CallFunctionObjArgs(e->fallback, l->kernel, grid, args, e->call, heur, NULL);
        if (done) { *out = done; r = 1; }   /* what the Python path's launch returned */
    }
done:
    Py_XDECREF(nargs);
    Py_XDECREF(heur);
    Py_XDECREF(grid_meta);
    Py_XDECREF(grid);
    Py_XDECREF(key);
    return r;
}

/* Runtime arguments passed by keyword (flash-linear-attention passes every argument by name, vLLM its float
 * ranges): the positional tuple the rest reads (*merged, new) and how many keywords it took (*taken; the others,
 * call-site constexprs and launch options, are read from the keywords as usual). 1 merged, 0 left to the Python
 * path (which binds or refuses), -1 error. */
static int merge_keywords(FastKernel *F, PyObject *args, PyObject *kwargs, PyObject **merged, Py_ssize_t *taken) {
    Py_ssize_t given = PyTuple_Size(args);
    if (!kwargs || !F->runtime_names || given > F->n) return 0;
    PyObject *t = PyTuple_New(F->n);
    if (!t) return -1;
    *taken = 0;
    for (Py_ssize_t i = 0; i < F->n; i++) {
        PyObject *v = PyDict_GetItem(kwargs, PyTuple_GetItem(F->runtime_names, i));   /* borrowed */
        if (i < given) {
            if (v) { Py_DECREF(t); return 0; }                            /* passed twice: Python says so */
            v = PyTuple_GetItem(args, i);
        } else {
            if (!v) { Py_DECREF(t); return 0; }                           /* missing: Python says so */
            (*taken)++;
        }
        Py_INCREF(v);
        PyTuple_SetItem(t, i, v);                                         /* steals the reference */
    }
    *merged = t;
    return 1;
}

static int fast_call_read(Launch *l, PyObject *args, PyObject *kwargs, Py_ssize_t taken, PyObject **out);

/* Under a custom op's guard (lo0, hi0, lo1, hi1...: the memory of the arguments its schema says it does not write),
 * checked before heuristics and pre-hooks run (a pre-hook such as init_to_zero writes too): 1 where no pointer the
 * kernel writes through starts in a guarded range, 0 otherwise, and for what the C path does not read here (a
 * descriptor's tensor, an unreadable guard): the Python path then checks (and refuses, naming the argument) or
 * launches. */
static int guard_allows(FastKernel *F, PyObject *guard, const CallKey *k, const uint64_t *vals) {
    uint64_t w = F->written;
    if (!w) return 1;
    if (w & k->descs) return 0;
    Py_ssize_t n = PyTuple_Size(guard);
    for (Py_ssize_t j = 0; j + 1 < n; j += 2) {   /* each range read once, against every written pointer */
        unsigned long long lo = as_u64(PyTuple_GetItem(guard, j)), hi = as_u64(PyTuple_GetItem(guard, j + 1));
        if (PyErr_Occurred()) { PyErr_Clear(); return 0; }
        for (int i = 0; i < F->n_ptr; i++) {
            int p = F->ptr_pos[i];
            if (((w >> p) & 1) && k->ptypes[i] != Py_None && k->ptypes[i] != (PyObject *)&PyLong_Type
                && vals[p] >= lo && vals[p] < hi)
                return 0;
        }
    }
    return 1;
}

/* A call passing parameters by position beyond the leading runtime arguments: call-site constexprs after them
 * (mamba's layer norm passes its flags and BLOCK_N so), or a kernel whose constexprs come between its runtime
 * parameters (Liger's cross entropy). Bound as Kernel._bind binds: each positional argument as the parameter it
 * stands for (a call-site one as its keyword), then the runtime arguments not given by position from the keywords.
 * 1 launched, 0 left to the Python path (a parameter passed twice or missing, one never passed: Python binds or
 * refuses), -1 error. */
static int bind_positional(Launch *l, PyObject *args, PyObject *kwargs, PyObject **out) {
    FastKernel *F = (FastKernel *)l->fast;
    Py_ssize_t given = PyTuple_Size(args), taken = 0;
    if (given > F->n_param || !F->runtime_names) return 0;
    PyObject *kw = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
    if (!kw) return -1;
    PyObject *head = PyTuple_New(F->n);
    char filled[MAX_ARGS] = {0};
    int r = -1;
    if (!head) goto done;
    for (Py_ssize_t i = 0; i < given; i++) {
        int s = F->param_slot[i];
        if (s < 0) { r = 0; goto done; }
        PyObject *name = s < F->n ? PyTuple_GetItem(F->runtime_names, s) : PyTuple_GetItem(F->call_names, s - F->n);
        PyObject *v = PyTuple_GetItem(args, i);
        int has = PyDict_Contains(kw, name);
        if (has) { r = has < 0 ? -1 : 0; goto done; }
        if (s >= F->n) {
            if (PyDict_SetItem(kw, name, v) < 0) goto done;
            continue;
        }
        Py_INCREF(v);
        PyTuple_SetItem(head, s, v);   /* steals the reference */
        filled[s] = 1;
    }
    for (int j = 0; j < F->n; j++) {
        if (filled[j]) continue;
        PyObject *v = PyDict_GetItem(kw, PyTuple_GetItem(F->runtime_names, j));   /* borrowed */
        if (!v) { r = 0; goto done; }
        Py_INCREF(v);
        PyTuple_SetItem(head, j, v);
        taken++;
    }
    r = fast_call_read(l, head, kw, taken, out);
done:
    Py_XDECREF(head);
    Py_DECREF(kw);
    return r;
}

/* 1 launched (*out: what the launch returns, a new reference), 0 left to the Python path, -1 error. */
static int fast_call(Launch *l, PyObject *args, PyObject *kwargs, PyObject **out) {
    FastKernel *F = (FastKernel *)l->fast;
    Py_ssize_t given = PyTuple_Size(args);
    if (given == F->n && F->n_lead == F->n) return fast_call_read(l, args, kwargs, 0, out);
    if (given > F->n_lead) return bind_positional(l, args, kwargs, out);
    PyObject *merged;
    Py_ssize_t taken;
    int m = merge_keywords(F, args, kwargs, &merged, &taken);
    if (m <= 0) return m;
    int r = fast_call_read(l, merged, kwargs, taken, out);
    Py_DECREF(merged);
    return r;
}

/* args: every runtime argument in order; kwargs: the call's keywords, of which `taken` were runtime arguments. */
static int fast_call_read(Launch *l, PyObject *args, PyObject *kwargs, Py_ssize_t taken, PyObject **out) {
    FastKernel *F = (FastKernel *)l->fast;
    /* LAUNCHES.skip: False as a rule; True while a custom op's Meta implementation runs (no launches); a custom op
     * guard (guard.py, a tuple of address ranges) while its real implementation runs */
    PyObject *skip = PyObject_GetAttr(F->launches, str_skip);
    if (!skip) { PyErr_Clear(); return 0; }
    PyObject *guard = NULL;   /* a new reference while set */
    if (skip == Py_False) Py_DECREF(skip);
    else if (PyTuple_Check(skip) && PyTuple_Size(skip)) guard = skip;
    else {
        int skipping = PyObject_IsTrue(skip);
        Py_DECREF(skip);
        if (skipping) { if (skipping < 0) PyErr_Clear(); return 0; }
    }
    CallKey k;
    uint64_t vals[MAX_ARGS];
    PyObject *objs[MAX_ARGS];   /* read_call sets those of every pointer position: the only ones read */
    if (!read_call(F, args, kwargs, taken, &k, vals, objs)) { Py_XDECREF(guard); return 0; }
    Entry *found = find(F, &k);
    if (!found || (guard && !guard_allows(F, guard, &k, vals))) {
        Py_XDECREF(guard);
        release_key(F, &k);
        return 0;
    }
    Py_XDECREF(guard);
    /* Its references, held before anything can run other threads (releasing the key, the grid function,
     * heuristics and pre-hooks), which may clear the cache. */
    Resolved e = found->r;
    Py_INCREF(e.launcher); Py_INCREF(e.meta); Py_INCREF(e.config); Py_INCREF(e.call);
    Py_XINCREF(e.kwargs); Py_XINCREF(e.late); Py_XINCREF(e.pre_hook); Py_XINCREF(e.fallback);
    release_key(F, &k);
    unsigned long long dims[3];
    int r;
    if (e.late) {
        r = late_call(l, F, args, kwargs, &k, &e, vals, objs, out);
    } else {
        r = eval_grid(l, args, e.meta, e.config, e.call, dims);
        if (r == 1) r = launcher_launch((Launcher *)e.launcher, vals, objs, dims[0], dims[1], dims[2]) < 0 ? -1 : 1;
        if (r == 1) { *out = launcher_result(e.launcher); set_last(F, e.launcher); }
    }
    Py_DECREF(e.launcher); Py_DECREF(e.meta); Py_DECREF(e.config); Py_DECREF(e.call);
    Py_XDECREF(e.kwargs); Py_XDECREF(e.late); Py_XDECREF(e.pre_hook); Py_XDECREF(e.fallback);
    return r;
}

static PyObject *Launch_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    Launch *l = (Launch *)self;
    if (l->fast) {
        PyObject *out = NULL;
        int r = fast_call(l, args, kwargs, &out);
        if (r == 1) {
            if (out) return out;
            Py_RETURN_NONE;
        }
        Py_XDECREF(out);
        if (r < 0) return NULL;
    }
    PyObject *kw = kwargs ? kwargs : PyDict_New();
    if (!kw) return NULL;
    if (kwargs) Py_INCREF(kw);
    PyObject *r = PyObject_CallMethodObjArgs(l->kernel, str_run, l->grid, args, kw, NULL);   /* what it returns */
    Py_DECREF(kw);
    return r;
}

static PyType_Slot Launch_slots[] = {
    {Py_tp_dealloc, Launch_dealloc},
    {Py_tp_call, Launch_call},
    {Py_tp_doc, "kernel[grid]: call it with the kernel's arguments."},
    {0, NULL},
};
static PyType_Spec Launch_spec = {"_fastlaunch.Launch", sizeof(Launch), 0, Py_TPFLAGS_DEFAULT, Launch_slots};

/* ---------------------------------------------------------------------------------------------------------
 * KernelBase: what `kernel[grid]` does, in C.
 */
typedef struct {
    PyObject_HEAD
    PyObject *fast;
} KernelBase;

static int KernelBase_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((KernelBase *)self)->fast);
    return 0;
}

static int KernelBase_clear(PyObject *self) {
    Py_CLEAR(((KernelBase *)self)->fast);
    return 0;
}

static void KernelBase_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(((KernelBase *)self)->fast);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *KernelBase_subscript(PyObject *self, PyObject *grid) {
    Launch *l = (Launch *)PyType_GenericAlloc(LaunchType, 0);
    if (!l) return NULL;
    Py_INCREF(self); l->kernel = self;
    Py_INCREF(grid); l->grid = grid;
    Py_XINCREF(((KernelBase *)self)->fast); l->fast = ((KernelBase *)self)->fast;
    return (PyObject *)l;
}

static PyObject *KernelBase_get_fast(PyObject *self, void *closure) {
    (void)closure;
    PyObject *f = ((KernelBase *)self)->fast;
    if (!f) Py_RETURN_NONE;
    Py_INCREF(f);
    return f;
}

static PyObject *KernelBase_set_fast(PyObject *self, PyObject *fast) {
    if (fast != Py_None && !PyObject_TypeCheck(fast, FastKernelType)) {
        PyErr_SetString(PyExc_TypeError, "expected a FastKernel or None");
        return NULL;
    }
    PyObject *old = ((KernelBase *)self)->fast;
    if (fast == Py_None) ((KernelBase *)self)->fast = NULL;
    else { Py_INCREF(fast); ((KernelBase *)self)->fast = fast; }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef KernelBase_methods[] = {
    {"_set_fast", KernelBase_set_fast, METH_O, "Attach a FastKernel (or None: every call takes the Python path)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef KernelBase_getset[] = {
    {"_fast", KernelBase_get_fast, NULL, "The attached FastKernel, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot KernelBase_slots[] = {
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, KernelBase_dealloc},
    {Py_tp_traverse, KernelBase_traverse},
    {Py_tp_clear, KernelBase_clear},
    {Py_mp_subscript, KernelBase_subscript},
    {Py_tp_methods, KernelBase_methods},
    {Py_tp_getset, KernelBase_getset},
    {Py_tp_doc, "Base of the runtime's Kernel: kernel[grid] in C."},
    {0, NULL},
};
static PyType_Spec KernelBase_spec = {"_fastlaunch.KernelBase", sizeof(KernelBase), 0,
                                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                                      KernelBase_slots};

/* ---------------------------------------------------------------------------------------------------------
 * Driver: the NVIDIA driver calls of a first launch (cuda.py's _CudaDriverC), called from C. The ctypes driver
 * sets up fifteen prototypes and goes through ctypes for every call (about 0.3 ms more of a fresh process's first
 * call, measured locally); here each call is one C call. The entry points' addresses come from cuda.py (dlsym
 * through ctypes on the library torch loaded), so this file links against no libdl and the wheel's manylinux tag
 * stays what it is.
 * Each method returns the driver's code (and values): cuda.py turns codes into DriverError, as for ctypes.
 */
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*error_name_fn)(int, const char **);
typedef CUresult (*int_out_fn)(int *);
typedef CUresult (*device_get_fn)(int *, int);
typedef CUresult (*attribute_fn)(int *, int, int);
typedef CUresult (*name_fn)(char *, int, int);
typedef CUresult (*retain_fn)(void **, int);
typedef CUresult (*module_load_fn)(void **, const void *);
typedef CUresult (*get_function_fn)(void **, void *, const char *);
typedef CUresult (*func_get_fn)(int *, int, void *);
typedef CUresult (*func_set_fn)(void *, int, int);

typedef struct {
    PyObject_HEAD
    init_fn init;
    error_name_fn error_name;
    device_get_fn device_get;
    int_out_fn device_count;
    attribute_fn attribute;
    name_fn name;
    retain_fn retain;
    ctx_get_fn ctx_get;
    ctx_push_fn ctx_push;
    ctx_pop_fn ctx_pop;
    module_load_fn module_load;
    get_function_fn get_function;
    func_get_fn func_get;
    func_set_fn func_set;
    launch_fn launch;
    launch_ex_fn launch_ex;     /* CUDA 12, else NULL */
    encode_fn tensor_map;       /* CUDA 12, else NULL */
} Driver;

static PyTypeObject *DriverType;

/* Driver(entry_points): a dict from each driver function's name to its address (cuda.py looks them up with
 * dlsym on the library torch loaded); cuLaunchKernelEx and cuTensorMapEncodeTiled (CUDA 12) may be missing. */
static PyObject *Driver_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"entry_points", NULL};
    PyObject *points;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, &PyDict_Type, &points)) return NULL;
    Driver *D = (Driver *)PyType_GenericAlloc(type, 0);
    if (!D) return NULL;
    struct { const char *name; void **slot; int required; } table[] = {
        {"cuInit", (void **)&D->init, 1}, {"cuGetErrorName", (void **)&D->error_name, 1},
        {"cuDeviceGet", (void **)&D->device_get, 1}, {"cuDeviceGetCount", (void **)&D->device_count, 1},
        {"cuDeviceGetAttribute", (void **)&D->attribute, 1}, {"cuDeviceGetName", (void **)&D->name, 1},
        {"cuDevicePrimaryCtxRetain", (void **)&D->retain, 1}, {"cuCtxGetCurrent", (void **)&D->ctx_get, 1},
        {"cuCtxPushCurrent_v2", (void **)&D->ctx_push, 1}, {"cuCtxPopCurrent_v2", (void **)&D->ctx_pop, 1},
        {"cuModuleLoadData", (void **)&D->module_load, 1}, {"cuModuleGetFunction", (void **)&D->get_function, 1},
        {"cuFuncGetAttribute", (void **)&D->func_get, 1}, {"cuFuncSetAttribute", (void **)&D->func_set, 1},
        {"cuLaunchKernel", (void **)&D->launch, 1}, {"cuLaunchKernelEx", (void **)&D->launch_ex, 0},
        {"cuTensorMapEncodeTiled", (void **)&D->tensor_map, 0},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        PyObject *address = PyDict_GetItemString(points, table[i].name);   /* borrowed */
        unsigned long long a = address ? PyLong_AsUnsignedLongLong(address) : 0;
        if (PyErr_Occurred()) { Py_DECREF(D); return NULL; }
        *table[i].slot = (void *)(uintptr_t)a;
        if (!a && table[i].required) {
            PyErr_Format(PyExc_ValueError, "the driver library has no %s", table[i].name);
            Py_DECREF(D);
            return NULL;
        }
    }
    return (PyObject *)D;
}

static void Driver_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *code_and(CUresult code, PyObject *value) {   /* (code, value), stealing value */
    if (!value) return NULL;
    PyObject *r = Py_BuildValue("(iO)", code, value);
    Py_DECREF(value);
    return r;
}

static PyObject *Driver_init(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(((Driver *)self)->init(0));
}

/* error_name(code) -> str or None */
static PyObject *Driver_error_name(PyObject *self, PyObject *arg) {
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    const char *name = NULL;
    if (((Driver *)self)->error_name(code, &name) != 0 || !name) Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

/* device(index) -> (code, device) */
static PyObject *Driver_device(PyObject *self, PyObject *arg) {
    int index = (int)PyLong_AsLong(arg), dev = 0;
    if (index == -1 && PyErr_Occurred()) return NULL;
    CUresult code = ((Driver *)self)->device_get(&dev, index);
    return code_and(code, PyLong_FromLong(dev));
}

/* count() -> (code, n) */
static PyObject *Driver_count(PyObject *self, PyObject *unused) {
    (void)unused;
    int n = 0;
    CUresult code = ((Driver *)self)->device_count(&n);
    return code_and(code, PyLong_FromLong(n));
}

/* attribute(attr, device) -> (code, value) */
static PyObject *Driver_attribute(PyObject *self, PyObject *args) {
    int attr, dev, out = 0;
    if (!PyArg_ParseTuple(args, "ii", &attr, &dev)) return NULL;
    CUresult code = ((Driver *)self)->attribute(&out, attr, dev);
    return code_and(code, PyLong_FromLong(out));
}

/* name(device) -> (code, str) */
static PyObject *Driver_name(PyObject *self, PyObject *arg) {
    int dev = (int)PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    char buf[257] = {0};
    CUresult code = ((Driver *)self)->name(buf, 256, dev);
    return code_and(code, PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace"));
}

/* primary_context(device) -> (code, ctx) */
static PyObject *Driver_primary_context(PyObject *self, PyObject *arg) {
    int dev = (int)PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    void *ctx = NULL;
    CUresult code = ((Driver *)self)->retain(&ctx, dev);
    return code_and(code, PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)ctx));
}

/* load(ctx, image, name, shared, max_shared) -> (code, failed call or None, function): as _CudaDriver.load, the
 * module loaded into `ctx` pushed current, the function looked up, dynamic shared memory above 48 KB opted into,
 * the context popped (also after a failure, whose call is named). */
static PyObject *Driver_load(PyObject *self, PyObject *args) {
    Driver *D = (Driver *)self;
    unsigned long long ctx;
    const char *image, *name;
    Py_ssize_t image_len;
    int shared, max_shared;
    if (!PyArg_ParseTuple(args, "Ky#sii", &ctx, &image, &image_len, &name, &shared, &max_shared)) return NULL;
    (void)image_len;
    const char *what = NULL;
    void *module = NULL, *fn = NULL, *popped = NULL;
    CUresult code = D->ctx_push((void *)(uintptr_t)ctx);
    if (code != 0) return Py_BuildValue("(isK)", code, "cuCtxPushCurrent", 0ULL);
    if ((code = D->module_load(&module, image)) != 0) what = "cuModuleLoadData";
    else if ((code = D->get_function(&fn, module, name)) != 0) what = "cuModuleGetFunction";
    else if (shared > 49152) {
        int stat = 0;
        if ((code = D->func_get(&stat, 1, fn)) != 0) what = "cuFuncGetAttribute";   /* SHARED_SIZE_BYTES */
        else if ((code = D->func_set(fn, 8, max_shared - stat)) != 0) what = "cuFuncSetAttribute";
    }
    CUresult pop = D->ctx_pop(&popped);
    if (code == 0 && pop != 0) { code = pop; what = "cuCtxPopCurrent"; }
    if (what) return Py_BuildValue("(isK)", code, what, 0ULL);
    return Py_BuildValue("(iOK)", 0, Py_None, (unsigned long long)(uintptr_t)fn);
}

/* function_attribute(attr, function) -> (code, value) */
static PyObject *Driver_function_attribute(PyObject *self, PyObject *args) {
    int attr, out = 0;
    unsigned long long fn;
    if (!PyArg_ParseTuple(args, "iK", &attr, &fn)) return NULL;
    CUresult code = ((Driver *)self)->func_get(&out, attr, (void *)(uintptr_t)fn);
    return code_and(code, PyLong_FromLong(out));
}

static PyObject *Driver_current_context(PyObject *self, PyObject *unused) {
    (void)unused;
    void *ctx = NULL;
    CUresult code = ((Driver *)self)->ctx_get(&ctx);
    return code_and(code, PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)ctx));
}

static PyObject *Driver_push(PyObject *self, PyObject *arg) {
    unsigned long long ctx = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(((Driver *)self)->ctx_push((void *)(uintptr_t)ctx));
}

static PyObject *Driver_pop(PyObject *self, PyObject *unused) {
    (void)unused;
    void *ctx = NULL;
    return PyLong_FromLong(((Driver *)self)->ctx_pop(&ctx));
}

/* entry_points() -> dict: the addresses a C Launcher calls (as _CudaDriver.entry_points gives them). */
static PyObject *Driver_entry_points(PyObject *self, PyObject *unused) {
    (void)unused;
    Driver *D = (Driver *)self;
    return Py_BuildValue("{sKsKsKsKsKsK}", "launch", (unsigned long long)(uintptr_t)D->launch,
                         "ctx_get", (unsigned long long)(uintptr_t)D->ctx_get,
                         "ctx_push", (unsigned long long)(uintptr_t)D->ctx_push,
                         "ctx_pop", (unsigned long long)(uintptr_t)D->ctx_pop,
                         "launch_ex", (unsigned long long)(uintptr_t)D->launch_ex,
                         "tensor_map", (unsigned long long)(uintptr_t)D->tensor_map);
}

static PyMethodDef Driver_methods[] = {
    {"init", Driver_init, METH_NOARGS, "cuInit(0) -> code"},
    {"error_name", Driver_error_name, METH_O, "cuGetErrorName(code) -> str or None"},
    {"device", Driver_device, METH_O, "cuDeviceGet(index) -> (code, device)"},
    {"count", Driver_count, METH_NOARGS, "cuDeviceGetCount() -> (code, n)"},
    {"attribute", Driver_attribute, METH_VARARGS, "cuDeviceGetAttribute(attr, device) -> (code, value)"},
    {"name", Driver_name, METH_O, "cuDeviceGetName(device) -> (code, name)"},
    {"primary_context", Driver_primary_context, METH_O, "cuDevicePrimaryCtxRetain(device) -> (code, ctx)"},
    {"load", Driver_load, METH_VARARGS, "load(ctx, image, name, shared, max_shared) -> (code, failed, function)"},
    {"function_attribute", Driver_function_attribute, METH_VARARGS, "cuFuncGetAttribute -> (code, value)"},
    {"current_context", Driver_current_context, METH_NOARGS, "cuCtxGetCurrent() -> (code, ctx)"},
    {"push", Driver_push, METH_O, "cuCtxPushCurrent(ctx) -> code"},
    {"pop", Driver_pop, METH_NOARGS, "cuCtxPopCurrent() -> code"},
    {"entry_points", Driver_entry_points, METH_NOARGS, "the C Launcher's driver entry points"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Driver_slots[] = {
    {Py_tp_new, Driver_new},
    {Py_tp_dealloc, Driver_dealloc},
    {Py_tp_methods, Driver_methods},
    {Py_tp_doc, "The NVIDIA driver calls of a first launch, from C (cuda.py's _CudaDriverC)."},
    {0, NULL},
};
static PyType_Spec Driver_spec = {"_fastlaunch.Driver", sizeof(Driver), 0, Py_TPFLAGS_DEFAULT, Driver_slots};

/* --------------------------------------------------------------------------------------------------------- */
static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_fastlaunch", "forge-aot's C launch path (optional; see fastpath.py).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **out) {
    PyObject *t = PyType_FromSpec(spec);
    if (!t) return -1;
    *out = (PyTypeObject *)t;
    Py_INCREF(t);
    const char *name = strrchr(spec->name, '.') + 1;
    if (PyModule_AddObject(m, name, t) < 0) { Py_DECREF(t); return -1; }
    return 0;
}

PyMODINIT_FUNC PyInit__fastlaunch(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    str_run = PyUnicode_InternFromString("run");
    str_skip = PyUnicode_InternFromString("skip");
    str_dtype = PyUnicode_InternFromString("dtype");
    str_named_args = PyUnicode_InternFromString("named_args");
    str_base = PyUnicode_InternFromString("base");
    str_block_shape = PyUnicode_InternFromString("block_shape");
    str_shape = PyUnicode_InternFromString("shape");
    str_strides = PyUnicode_InternFromString("strides");
    str_padding = PyUnicode_InternFromString("padding");
    str_data_ptr = PyUnicode_InternFromString("data_ptr");
    str_pre_hooks = PyUnicode_InternFromString("pre_hooks");
    if (!str_run || !str_skip || !str_dtype || !str_named_args || !str_base || !str_block_shape || !str_shape
        || !str_strides || !str_padding || !str_data_ptr || !str_pre_hooks
        || add_type(m, &Launcher_spec, &LauncherType) < 0 || add_type(m, &FastKernel_spec, &FastKernelType) < 0
        || add_type(m, &Launch_spec, &LaunchType) < 0 || add_type(m, &KernelBase_spec, &KernelBaseType) < 0
        || add_type(m, &Driver_spec, &DriverType) < 0
        || PyModule_AddIntConstant(m, "MAX_ARGS", MAX_ARGS) < 0 || PyModule_AddIntConstant(m, "MAX_BLOCK", MAX_BLOCK) < 0
        || PyModule_AddIntConstant(m, "MAX_TYPEVARS", MAX_TYPEVARS) < 0
        || PyModule_AddIntConstant(m, "MAX_KEYS", MAX_KEYS) < 0 || PyModule_AddIntConstant(m, "MAX_CALLS", MAX_CALLS) < 0
        || PyModule_AddIntConstant(m, "ABI", 14) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
