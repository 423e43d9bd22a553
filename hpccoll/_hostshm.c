// _hostshm.c - the host backend's shared-memory Allreduce: barrier-free, in rank order.
//
// The ranks of one node map one shared file (made and unlinked by hpccoll/backends/host.py).
// Every rank owns one region of it:
//
//   region r = base + r * region_bytes        (region_bytes: a whole number of pages)
//     [0, 8)                      u64 flag[0]   the last call of parity 0 whose data is in slot[0]
//     [64, 72)                    u64 flag[1]   the same for parity 1 (its own cache line)
//     [128, 128 + slot)           slot[0]       this rank's input of the calls of parity 0
//     [128 + slot, 128 + 2 slot)  slot[1]       ... of parity 1
//
// Call `seq` (1, 2, 3 ...: the Segment counts the calls, and every rank makes the same calls in
// the same order) on every rank: copy the input into my slot[seq & 1], store flag[seq & 1] = seq
// (release), wait until every peer's flag[seq & 1] reads seq (acquire), then reduce every rank's
// slot in rank order, ((x0 op x1) op x2) ..., into the output.  No barrier, no MPI.
//
// Why a slot is never overwritten while a peer still reads it: a rank writes slot[p] again at
// call seq + 2 only after finishing call seq + 1, which needed every peer's flag of seq + 1,
// which each peer stores only after it finished reading the slots of call seq.  The flags are
// 64-bit and only grow, so a flag left from an earlier call never equals the current seq.
//
// The results are hpccoll.ops.reduce_in_rank_order's, bit for bit: each step rounds to the
// dtype (FLT_EVAL_METHOD 0, no -ffast-math, no contraction), integers wrap (unsigned
// arithmetic), float MAX / MIN compare order-preserving keys (+0 above -0, a NaN wins), and
// every NaN of a float result becomes the canonical NaN of cuda/hc_abi.h.
//
// A wait is bounded: it spins, then yields its core and releases the GIL (ranks may outnumber
// cores), and reads the clock every CLOCK_EVERY turns; past the timeout it returns the rank it
// waited for, and Python raises CollectiveTimeout.  While it yields, Python's signal handlers run
// every 0.1 s (Ctrl-C interrupts a wait).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hc_abi.h"

#if FLT_EVAL_METHOD != 0
#error "float and double arithmetic must round to their own width at every step (FLT_EVAL_METHOD 0)"
#endif
#if ATOMIC_LLONG_LOCK_FREE != 2
#error "the flags need lock-free (hence address-free) 64-bit atomics to work across processes"
#endif
#ifdef __FAST_MATH__
#error "compile without -ffast-math: the reductions must round as IEEE arithmetic does"
#endif

#define LINE 64
#define HEAD (2 * LINE)       // the two flags, each on its own cache line
#define PAGE 4096
#define FAST_SPINS 256        // spins before a waiter starts yielding its core (and the GIL)
#define CLOCK_EVERY 64        // turns of a yielding wait between clock reads

typedef _Atomic u64 flag_t;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// The deadline `timeout_ns` from now, saturated: INT64_MAX (a timeout too long for the clock's
// arithmetic, an infinite one among them) is a deadline no clock reading passes.
static inline int64_t deadline_after(int64_t timeout_ns) {
    const int64_t now = now_ns();
    return timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
}

static size_t region_bytes(size_t slot) { return (HEAD + 2 * slot + PAGE - 1) / PAGE * PAGE; }

// ---- the segment ----------------------------------------------------------------------------
typedef struct {
    PyObject_HEAD
    char *base;        // the mapping; NULL once closed
    size_t map_bytes, region, slot;
    int rank, size;
    u64 seq;           // this communicator's shared-memory calls so far
    int64_t timeout_ns;  // INT64_MAX: wait forever
    int broken;        // a call timed out (here or on the MPI path): no call may run
    int busy;          // a call is running (it may have released the GIL)
    int closing;       // close() came while busy: the call unmaps when it ends
} Segment;

static inline flag_t *flag_of(const Segment *s, int r, unsigned parity) {
    return (flag_t *)(s->base + (size_t)r * s->region + parity * LINE);
}

static inline char *slot_of(const Segment *s, int r, unsigned parity) {
    return s->base + (size_t)r * s->region + HEAD + parity * s->slot;
}

static void unmap(Segment *s) {
    if (s->base) {
        munmap(s->base, s->map_bytes);
        s->base = NULL;
    }
}

// ---- reductions in rank order -----------------------------------------------------------------
// src[r]: rank r's slot.  The output never aliases a slot (it is the caller's memory).
#define ARITH(NAME, T, EXPR)                                                          \
    static void NAME(T *restrict o, const char *const *src, int nsrc, size_t n) {     \
        const T *a = (const T *)src[0], *b = (const T *)src[1];                       \
        for (size_t i = 0; i < n; ++i) {                                              \
            const T x = a[i], y = b[i];                                               \
            o[i] = (EXPR);                                                            \
        }                                                                             \
        for (int r = 2; r < nsrc; ++r) {                                              \
            const T *c = (const T *)src[r];                                           \
            for (size_t i = 0; i < n; ++i) {                                          \
                const T x = o[i], y = c[i];                                           \
                o[i] = (EXPR);                                                        \
            }                                                                         \
        }                                                                             \
    }

ARITH(sum_f32, float, x + y)
ARITH(prod_f32, float, x * y)
ARITH(sum_f64, double, x + y)
ARITH(prod_f64, double, x * y)
// Integer SUM / PROD wrap around: unsigned arithmetic (signed overflow is undefined in C).
ARITH(sum_u32, uint32_t, x + y)
ARITH(prod_u32, uint32_t, x * y)
ARITH(sum_u64, uint64_t, x + y)
ARITH(prod_u64, uint64_t, x * y)
ARITH(max_i32, int32_t, x > y ? x : y)
ARITH(min_i32, int32_t, x < y ? x : y)
ARITH(max_i64, int64_t, x > y ? x : y)
ARITH(min_i64, int64_t, x < y ? x : y)

// Every NaN of a float result (magnitude bits above infinity's) becomes the canonical NaN.
#define CANONICALIZE(NAME, U, MAG, INF, CANON)                          \
    static void NAME(U *restrict o, size_t n) {                         \
        for (size_t i = 0; i < n; ++i) {                                \
            const U b = o[i];                                           \
            o[i] = (b & (MAG)) > (INF) ? (U)(CANON) : b;                \
        }                                                               \
    }

CANONICALIZE(canon_f32, uint32_t, 0x7FFFFFFFu, 0x7F800000u, HC_CANON_NAN_F32)
CANONICALIZE(canon_f64, uint64_t, 0x7FFFFFFFFFFFFFFFull, 0x7FF0000000000000ull, HC_CANON_NAN_F64)

// Float MAX / MIN on keys whose unsigned order is ops.ordered_keys' order: a positive float's
// bits with the sign bit set, a negative float's bits inverted (so -0 sits just below +0), a NaN
// the key that wins (all ones for MAX, zero for MIN: no number's key is either).  The output
// holds the keys while ranks are reduced, then the floats they stand for.
#define FKEYS(NAME, U, SIGN, INF, CANON, WIN, PICK)                                   \
    static inline U NAME##_key(U b) {                                                 \
        const U k = (b & (SIGN)) ? (U)~b : (U)(b | (SIGN));                           \
        return (b & (U)~(SIGN)) > (INF) ? (U)(WIN) : k;                               \
    }                                                                                 \
    static void NAME(U *restrict o, const char *const *src, int nsrc, size_t n) {     \
        const U *a = (const U *)src[0];                                               \
        for (size_t i = 0; i < n; ++i) o[i] = NAME##_key(a[i]);                       \
        for (int r = 1; r < nsrc; ++r) {                                              \
            const U *c = (const U *)src[r];                                           \
            for (size_t i = 0; i < n; ++i) {                                          \
                const U x = o[i], y = NAME##_key(c[i]);                               \
                o[i] = (PICK);                                                        \
            }                                                                         \
        }                                                                             \
        for (size_t i = 0; i < n; ++i) {                                              \
            const U k = o[i];                                                         \
            o[i] = k == (U)(WIN) ? (U)(CANON) : (k & (SIGN)) ? (U)(k & (U)~(SIGN)) : (U)~k; \
        }                                                                             \
    }

FKEYS(max_f32, uint32_t, 0x80000000u, 0x7F800000u, HC_CANON_NAN_F32, 0xFFFFFFFFu, x > y ? x : y)
FKEYS(min_f32, uint32_t, 0x80000000u, 0x7F800000u, HC_CANON_NAN_F32, 0u, x < y ? x : y)
FKEYS(max_f64, uint64_t, 0x8000000000000000ull, 0x7FF0000000000000ull, HC_CANON_NAN_F64,
      0xFFFFFFFFFFFFFFFFull, x > y ? x : y)
FKEYS(min_f64, uint64_t, 0x8000000000000000ull, 0x7FF0000000000000ull, HC_CANON_NAN_F64, 0ull,
      x < y ? x : y)

static size_t itemsize_of(int dtype) {
    switch (dtype) {
        case HC_F32: case HC_I32: return 4;
        case HC_F64: case HC_I64: return 8;
        default: return 0;
    }
}

static int known_op(int op) { return op == HC_SUM || op == HC_PROD || op == HC_MAX || op == HC_MIN; }

static void reduce(void *out, const char *const *src, int nsrc, size_t n, int dtype, int op) {
    switch (dtype) {
        case HC_F32:
            if (op == HC_MAX) max_f32(out, src, nsrc, n);
            else if (op == HC_MIN) min_f32(out, src, nsrc, n);
            else {
                (op == HC_SUM ? sum_f32 : prod_f32)(out, src, nsrc, n);
                canon_f32(out, n);
            }
            break;
        case HC_F64:
            if (op == HC_MAX) max_f64(out, src, nsrc, n);
            else if (op == HC_MIN) min_f64(out, src, nsrc, n);
            else {
                (op == HC_SUM ? sum_f64 : prod_f64)(out, src, nsrc, n);
                canon_f64(out, n);
            }
            break;
        case HC_I32:
            if (op == HC_SUM) sum_u32(out, src, nsrc, n);
            else if (op == HC_PROD) prod_u32(out, src, nsrc, n);
            else (op == HC_MAX ? max_i32 : min_i32)(out, src, nsrc, n);
            break;
        case HC_I64:
            if (op == HC_SUM) sum_u64(out, src, nsrc, n);
            else if (op == HC_PROD) prod_u64(out, src, nsrc, n);
            else (op == HC_MAX ? max_i64 : min_i64)(out, src, nsrc, n);
            break;
    }
}

// ---- one call -----------------------------------------------------------------------------------
#define LATE_INTERRUPTED (-2)  // a signal handler raised while the call waited (the exception is set)
#define SLOW_DONE 0
#define SLOW_LATE 1
#define SLOW_SIGNALS 2

// The yielding part of a wait, from peer *r on, without the GIL.  SLOW_DONE; SLOW_LATE with *r
// the rank whose flag had not come by the deadline; or SLOW_SIGNALS every SIGNAL_EVERY_NS, for
// the caller to run Python's signal handlers (Ctrl-C) and come back.
#define SIGNAL_EVERY_NS 100000000
static int wait_slow(const Segment *s, int *r, unsigned parity, u64 seq, int64_t deadline) {
    const int64_t signals_at = now_ns() + SIGNAL_EVERY_NS;
    for (; *r < s->size; ++*r) {
        if (*r == s->rank) continue;
        flag_t *f = flag_of(s, *r, parity);
        unsigned turns = 0;
        while (atomic_load_explicit(f, memory_order_acquire) != seq) {
            sched_yield();
            if (++turns % CLOCK_EVERY == 0) {
                const int64_t t = now_ns();
                if (t > deadline) return SLOW_LATE;
                if (t > signals_at) return SLOW_SIGNALS;
            }
        }
    }
    return SLOW_DONE;
}

// Wait for every peer's flag of `seq`: spin with the GIL first (a peer is usually a microsecond
// away), then yield the core without the GIL.  -1; or the rank that never came; or
// LATE_INTERRUPTED.
static int wait_peers(const Segment *s, unsigned parity, u64 seq) {
    int r = 0;
    for (; r < s->size; ++r) {
        if (r == s->rank) continue;
        flag_t *f = flag_of(s, r, parity);
        for (int spins = 0; atomic_load_explicit(f, memory_order_acquire) != seq; ++spins) {
            if (spins == FAST_SPINS) goto slow;
            cpu_relax();
        }
    }
    return -1;
slow:;
    const int64_t deadline = deadline_after(s->timeout_ns);
    for (;;) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = wait_slow(s, &r, parity, seq, deadline);
        Py_END_ALLOW_THREADS
        if (rc == SLOW_DONE) return -1;
        if (rc == SLOW_LATE) return r;
        if (PyErr_CheckSignals() < 0) return LATE_INTERRUPTED;
    }
}

// One Allreduce of `nbytes` (<= the slot) from `send` into `recv` (may be the same memory).
// Caller: holds the GIL, checked the segment is open and idle.  -1; or the rank that never came;
// or LATE_INTERRUPTED.  A call that did not finish leaves the segment broken: this rank has
// posted its input and counted the call, and cannot know how far its peers got.
static int run_call(Segment *s, const void *send, void *recv, size_t nbytes, int dtype, int op) {
    const u64 seq = ++s->seq;
    const unsigned parity = (unsigned)(seq & 1);
    s->busy = 1;
    memcpy(slot_of(s, s->rank, parity), send, nbytes);
    atomic_store_explicit(flag_of(s, s->rank, parity), seq, memory_order_release);
    int late = wait_peers(s, parity, seq);
    if (late == -1) {
        const char *src[s->size];
        for (int r = 0; r < s->size; ++r) src[r] = slot_of(s, r, parity);
        reduce(recv, src, s->size, nbytes / itemsize_of(dtype), dtype, op);
    } else {
        s->broken = 1;
    }
    s->busy = 0;
    if (s->closing) unmap(s);
    return late;
}

static int check_codes(int dtype, int op) {
    if (!itemsize_of(dtype) || !known_op(op)) {
        PyErr_Format(PyExc_ValueError, "_hostshm: dtype code %d / op code %d: the shared-memory Allreduce "
                     "runs float32, float64, int32, int64 with SUM, PROD, MAX, MIN", dtype, op);
        return -1;
    }
    return 0;
}

// send/recv as buffers of one call: contiguous, the same size, at most a slot, whole elements.
static int get_buffers(const Segment *s, PyObject *send, PyObject *recv, int dtype, Py_buffer *sv, Py_buffer *rv) {
    if (PyObject_GetBuffer(recv, rv, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(send, sv, PyBUF_ANY_CONTIGUOUS) < 0) {
        PyBuffer_Release(rv);
        return -1;
    }
    const char *bad = NULL;
    if (sv->len != rv->len) bad = "sendbuf and recvbuf differ in size";
    else if ((size_t)rv->len > s->slot) bad = "the message is larger than a slot";
    else if ((size_t)rv->len % itemsize_of(dtype)) bad = "the size is not a whole number of elements";
    if (bad) {
        PyErr_Format(PyExc_ValueError, "_hostshm: %s (%zd and %zd bytes, slot %zu)", bad, sv->len, rv->len, s->slot);
        PyBuffer_Release(sv);
        PyBuffer_Release(rv);
        return -1;
    }
    return 0;
}

static int usable(const Segment *s) {
    if (!s->base) {
        PyErr_SetString(PyExc_ValueError, "_hostshm: the segment is closed");
        return 0;
    }
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_hostshm: another call is in flight on this segment");
        return 0;
    }
    return 1;
}

// ---- Segment: the Python type -----------------------------------------------------------------
static int Segment_init(Segment *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "rank", "size", "slot_bytes", "timeout", NULL};
    int fd, rank, size;
    Py_ssize_t slot;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiind", names, &fd, &rank, &size, &slot, &timeout)) return -1;
    if (s->base) {
        PyErr_SetString(PyExc_RuntimeError, "_hostshm.Segment: already initialized");
        return -1;
    }
    if (size < 2 || rank < 0 || rank >= size || slot <= 0 || slot % LINE || !(timeout > 0)) {
        PyErr_Format(PyExc_ValueError, "_hostshm.Segment: rank %d of %d ranks, slot %zd bytes, timeout %g s: "
                     "use 0 <= rank < size, size >= 2, a positive slot of whole cache lines (64 bytes), "
                     "a positive timeout", rank, size, slot, timeout);
        return -1;
    }
    s->slot = (size_t)slot;
    s->region = region_bytes(s->slot);
    s->map_bytes = s->region * (size_t)size;
    void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    s->base = p;
    s->rank = rank;
    s->size = size;
    s->seq = 0;
    // (double)INT64_MAX is 2^63: every product below it converts to int64 exactly enough
    s->timeout_ns = timeout * 1e9 >= (double)INT64_MAX ? INT64_MAX : (int64_t)(timeout * 1e9);
    s->broken = s->busy = s->closing = 0;
    return 0;
}

static void Segment_dealloc(Segment *s) {
    unmap(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *Segment_allreduce(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "Segment.allreduce(sendbuf, recvbuf, dtype_code, op_code)");
        return NULL;
    }
    const int dtype = PyLong_AsLong(args[2]), op = PyLong_AsLong(args[3]);
    if (PyErr_Occurred() || check_codes(dtype, op) < 0 || !usable(s)) return NULL;
    Py_buffer sv, rv;
    if (get_buffers(s, args[0], args[1], dtype, &sv, &rv) < 0) return NULL;
    const int late = run_call(s, sv.buf, rv.buf, (size_t)rv.len, dtype, op);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (late == LATE_INTERRUPTED) return NULL;
    return PyLong_FromLong(late);
}

static PyObject *Segment_close(Segment *s, PyObject *unused) {
    if (s->busy) s->closing = 1;
    else unmap(s);
    Py_RETURN_NONE;
}

static PyObject *Segment_get_seq(Segment *s, void *c) { return PyLong_FromUnsignedLongLong(s->seq); }
static PyObject *Segment_get_slot(Segment *s, void *c) { return PyLong_FromSize_t(s->slot); }
static PyObject *Segment_get_closed(Segment *s, void *c) { return PyBool_FromLong(s->base == NULL); }
static PyObject *Segment_get_broken(Segment *s, void *c) { return PyBool_FromLong(s->broken); }

static int Segment_set_broken(Segment *s, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "broken cannot be deleted");
        return -1;
    }
    const int t = PyObject_IsTrue(v);
    if (t < 0) return -1;
    s->broken = t;
    return 0;
}

static PyMethodDef Segment_methods[] = {
    {"allreduce", (PyCFunction)(void (*)(void))Segment_allreduce, METH_FASTCALL,
     "allreduce(sendbuf, recvbuf, dtype_code, op_code) -> -1 when done, else the rank that never came "
     "(the call then timed out and the segment is broken).  An exception raised by a signal handler "
     "while it waits propagates (the segment is then broken too)."},
    {"close", (PyCFunction)Segment_close, METH_NOARGS, "Unmap the segment (local; no peer is waited for)."},
    {NULL},
};

static PyGetSetDef Segment_getset[] = {
    {"seq", (getter)Segment_get_seq, NULL, "calls made on this segment so far", NULL},
    {"slot_bytes", (getter)Segment_get_slot, NULL, "the largest message, in bytes", NULL},
    {"closed", (getter)Segment_get_closed, NULL, "unmapped", NULL},
    {"broken", (getter)Segment_get_broken, (setter)Segment_set_broken, "no call may run (a timeout happened)", NULL},
    {NULL},
};

static PyTypeObject SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccoll._hostshm.Segment",
    .tp_doc = "Segment(fd, rank, size, slot_bytes, timeout): this rank's map of the shared file `fd` "
              "(size regions of segment_bytes(1, slot_bytes) bytes) and its call counter.",
    .tp_basicsize = sizeof(Segment),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Segment_init,
    .tp_dealloc = (destructor)Segment_dealloc,
    .tp_methods = Segment_methods,
    .tp_getset = Segment_getset,
};

// ---- Plan: one call's buffers and codes, bound once ---------------------------------------------
typedef struct {
    PyObject_HEAD
    Segment *seg;          // set by a successful init, with both buffers below
    Py_buffer send, recv;  // held while the plan lives
    int dtype, op;
    PyObject *on_fail;  // on_fail(rank): the rank that never came, or -1 (broken or closed before the call)
} Plan;

static int Plan_init(Plan *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"segment", "sendbuf", "recvbuf", "dtype_code", "op_code", "on_fail", NULL};
    PyObject *seg, *send, *recv, *on_fail;
    int dtype, op;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOiiO", names, &SegmentType, &seg, &send, &recv, &dtype, &op,
                                     &on_fail))
        return -1;
    if (p->seg) {
        PyErr_SetString(PyExc_RuntimeError, "_hostshm.Plan: already initialized");
        return -1;
    }
    if (check_codes(dtype, op) < 0) return -1;
    if (!PyCallable_Check(on_fail)) {
        PyErr_SetString(PyExc_TypeError, "_hostshm.Plan: on_fail must be callable");
        return -1;
    }
    if (get_buffers((Segment *)seg, send, recv, dtype, &p->send, &p->recv) < 0) return -1;
    p->dtype = dtype;
    p->op = op;
    Py_INCREF(seg);
    p->seg = (Segment *)seg;
    Py_INCREF(on_fail);
    p->on_fail = on_fail;
    return 0;
}

static void Plan_dealloc(Plan *p) {
    if (p->seg) {  // initialized: the buffers are held
        PyBuffer_Release(&p->send);
        PyBuffer_Release(&p->recv);
    }
    Py_XDECREF(p->seg);
    Py_XDECREF(p->on_fail);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *fail(Plan *p, int code) {
    PyObject *arg = PyLong_FromLong(code);
    if (!arg) return NULL;
    PyObject *res = PyObject_CallOneArg(p->on_fail, arg);
    Py_DECREF(arg);
    if (!res) return NULL;
    Py_DECREF(res);
    Py_RETURN_NONE;
}

// launch(stream=None): the call, one C call from Python (the host backend ignores streams).
static PyObject *Plan_launch(Plan *p, PyObject *const *args, Py_ssize_t nargs) {
    Segment *s = p->seg;
    if (!s) {
        PyErr_SetString(PyExc_RuntimeError, "_hostshm.Plan: not initialized");
        return NULL;
    }
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "launch(stream=None)");
        return NULL;
    }
    if (!s->base || s->broken || s->busy) return fail(p, -1);
    const int late = run_call(s, p->send.buf, p->recv.buf, (size_t)p->recv.len, p->dtype, p->op);
    if (late == LATE_INTERRUPTED) return NULL;
    if (late >= 0) return fail(p, late);
    Py_RETURN_NONE;
}

static PyMethodDef Plan_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Plan_launch, METH_FASTCALL,
     "launch(stream=None): run the call; on a timeout (or a broken or closed segment) on_fail raises."},
    {NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccoll._hostshm.Plan",
    .tp_doc = "Plan(segment, sendbuf, recvbuf, dtype_code, op_code, on_fail): a repeated Allreduce of these "
              "buffers, bound once; `launch()` runs it.",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

// ---- the module --------------------------------------------------------------------------------
static PyObject *segment_bytes(PyObject *m, PyObject *args) {
    int size;
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "in", &size, &slot)) return NULL;
    if (size < 1 || slot <= 0 || slot % LINE) {
        PyErr_SetString(PyExc_ValueError,
                        "segment_bytes(size, slot_bytes): a positive size, a slot of whole cache lines (64 bytes)");
        return NULL;
    }
    return PyLong_FromSize_t(region_bytes((size_t)slot) * (size_t)size);
}

static PyMethodDef module_methods[] = {
    {"segment_bytes", segment_bytes, METH_VARARGS, "segment_bytes(size, slot_bytes): the shared file's size."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hostshm",
    "The host backend's shared-memory Allreduce (see the comment at the top of hpccoll/_hostshm.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__hostshm(void) {
    if (PyType_Ready(&SegmentType) < 0 || PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Segment", (PyObject *)&SegmentType) < 0 ||
        PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
