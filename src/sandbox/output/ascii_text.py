"""A window's ASCII output kept as the `str` it will be returned as, grown in place.

Why it exists: a window returns text, and a big one (an `output_limit_bytes` raised to
tens of MB) used to be held as bytes and decoded at the window's end. Fresh memory is
what such a window costs: the bytes, then the text, each written once into pages the
kernel has to fault in and zero (50 MB costs 20 ms on a VM; the read path itself is at
raw speed). Output that is ASCII needs no decoding at all: its text is its bytes. So
`AsciiText` (a few lines of C, built at first use by `sandbox.native`) appends each
chunk read straight into the buffer of the `str` the window will return, allocated
once and grown geometrically with `PyUnicode_Resize` (a `realloc`: `mremap` for a big
block, so its pages are moved, not copied), then trimmed to its length at the end.
The output costs one pass of fresh memory, as a raw reader that keeps bytes does.

Safety: the `str` is private to its `AsciiText` (one reference, never hashed or shared)
until `take()` trims it and hands it over; bytes past its length are never visible.
`append` refuses (returns False, keeping nothing of the chunk) a chunk that holds a
byte >= 0x80 or would pass the bound: the caller then takes what was kept as bytes
(`take_bytearray`) and goes on the decoding path. Only CPython on Linux with a C
compiler and Python's headers builds it; elsewhere, or with `SANDBOX_NATIVE_TEXT=0`,
`loaded()` stays None and every window decodes bytes as before.

Interface of an `AsciiText(bound)`: `append(data) -> bool`, `len()`, `bytes_from(start)
-> bytes` (a copy of the text from `start`, for `until` matching), `take() -> str` and
`take_bytearray() -> bytearray` (each hands over what was kept and empties it).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable
from typing import Protocol

from .. import native

DISABLE_VARIABLE = "SANDBOX_NATIVE_TEXT"
MODULE_NAME = "_sandbox_ascii_text"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* `text` is a compact ASCII str of length `cap` that only this object refers to; its
   first `len` characters are the output kept, the rest is not written yet. */
typedef struct {
    PyObject_HEAD
    PyObject *text;
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t bound;
} AsciiText;

static int all_ascii(const unsigned char *p, Py_ssize_t n) {
    uint64_t acc = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        acc |= word;
    }
    for (; i < n; i++)
        acc |= p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

static void forget(AsciiText *self) {
    Py_CLEAR(self->text);
    self->len = self->cap = 0;
}

static int AsciiText_init(AsciiText *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t bound;
    static char *names[] = {"bound", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &bound))
        return -1;
    if (bound < 0) {
        PyErr_SetString(PyExc_ValueError, "bound must not be negative");
        return -1;
    }
    forget(self);
    self->bound = bound;
    return 0;
}

static void AsciiText_dealloc(AsciiText *self) {
    Py_XDECREF(self->text);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for `need` characters: double the capacity (at least 256), never past the
   bound. PyUnicode_Resize reallocates in place: `text` has one reference and no hash. */
static int reserve(AsciiText *self, Py_ssize_t need) {
    Py_ssize_t cap = self->cap > self->bound / 2 ? self->bound : self->cap * 2;
    if (cap < 256)
        cap = 256;
    if (cap < need)
        cap = need;
    if (cap > self->bound)
        cap = self->bound;
    if (self->text == NULL) {
        self->text = PyUnicode_New(cap, 127);
        if (self->text == NULL)
            return -1;
    } else if (PyUnicode_Resize(&self->text, cap) < 0) {
        return -1;
    }
    self->cap = cap;
    return 0;
}

static PyObject *AsciiText_append(AsciiText *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = view.len;
    int kept = n <= self->bound - self->len && all_ascii(view.buf, n);
    if (kept && n > 0) {
        if (self->len + n > self->cap && reserve(self, self->len + n) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        memcpy(PyUnicode_1BYTE_DATA(self->text) + self->len, view.buf, n);
        self->len += n;
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(kept);
}

static PyObject *AsciiText_take(AsciiText *self, PyObject *unused) {
    PyObject *text = self->text;
    Py_ssize_t len = self->len;
    if (text == NULL)
        return PyUnicode_New(0, 0);
    Py_ssize_t cap = self->cap;
    self->text = NULL;
    self->len = self->cap = 0;
    if (PyUnicode_Resize(&text, len) < 0) {
        /* Nothing is lost: what was kept stays here for another try. */
        self->text = text;
        self->len = len;
        self->cap = cap;
        return NULL;
    }
    return text;
}

static PyObject *AsciiText_take_bytearray(AsciiText *self, PyObject *unused) {
    const char *data = self->text == NULL ? "" : (const char *)PyUnicode_1BYTE_DATA(self->text);
    PyObject *out = PyByteArray_FromStringAndSize(data, self->len);
    if (out != NULL)
        forget(self);
    return out;
}

static PyObject *AsciiText_bytes_from(AsciiText *self, PyObject *arg) {
    Py_ssize_t start = PyLong_AsSsize_t(arg);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    if (start < 0)
        start = 0;
    if (start >= self->len)
        return PyBytes_FromStringAndSize(NULL, 0);
    return PyBytes_FromStringAndSize(
        (const char *)PyUnicode_1BYTE_DATA(self->text) + start, self->len - start);
}

static Py_ssize_t AsciiText_length(AsciiText *self) {
    return self->len;
}

static PyMethodDef AsciiText_methods[] = {
    {"append", (PyCFunction)AsciiText_append, METH_O,
     "Keep the bytes if all are ASCII and within the bound; whether they were kept."},
    {"take", (PyCFunction)AsciiText_take, METH_NOARGS,
     "What was kept, as a str of its length; empties this."},
    {"take_bytearray", (PyCFunction)AsciiText_take_bytearray, METH_NOARGS,
     "What was kept, as a bytearray; empties this."},
    {"bytes_from", (PyCFunction)AsciiText_bytes_from, METH_O,
     "A bytes copy of what was kept from position `start` on."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods AsciiText_sequence = {.sq_length = (lenfunc)AsciiText_length};

static PyTypeObject AsciiTextType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_sandbox_ascii_text.AsciiText",
    .tp_doc = "ASCII output kept in the buffer of the str it will be returned as.",
    .tp_basicsize = sizeof(AsciiText),
    .tp_dealloc = (destructor)AsciiText_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = AsciiText_methods,
    .tp_as_sequence = &AsciiText_sequence,
    .tp_init = (initproc)AsciiText_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sandbox_ascii_text", NULL, -1};

PyMODINIT_FUNC PyInit__sandbox_ascii_text(void) {
    if (PyType_Ready(&AsciiTextType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AsciiTextType);
    if (PyModule_AddObject(m, "AsciiText", (PyObject *)&AsciiTextType) < 0) {
        Py_DECREF(&AsciiTextType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""


class AsciiText(Protocol):
    """The C type's interface (see the module docstring)."""

    def append(self, data: bytes | bytearray | memoryview, /) -> bool:
        """Keep `data` if every byte is ASCII and it fits the bound; whether it was kept."""

    def take(self) -> str:
        """What was kept, as a `str`; empties this."""

    def take_bytearray(self) -> bytearray:
        """What was kept, as a `bytearray`; empties this."""

    def bytes_from(self, start: int, /) -> bytes:
        """A copy of what was kept from position `start` on."""

    def __len__(self) -> int:
        """Characters (= bytes) kept."""


AsciiTextFactory = Callable[[int], AsciiText]


def _load() -> AsciiTextFactory:
    with _library() as path:
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, path)
        spec = importlib.util.spec_from_loader(MODULE_NAME, loader, origin=path)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    factory: AsciiTextFactory = module.AsciiText
    return factory


_PART = native.NativePart(_load)


def tried() -> bool:
    """Whether `prepare()` ran in this process (whatever it found)."""
    return _PART.tried


def loaded() -> AsciiTextFactory | None:
    """The `AsciiText` type if `prepare()` made it usable (never builds)."""
    return _PART.value


def reason() -> str:
    """Why `AsciiText` is not in use ("" when it is)."""
    return _PART.reason()


def prepare(wait_s: float | None = None) -> AsciiTextFactory | None:
    """Build (once per cache directory, source and Python ABI) and load the type in the
    background, waiting for it at most `wait_s` (None: until done); blocking, so
    sessions call it from a thread. Never raises: a failure is kept in `reason()` and
    windows decode bytes instead."""
    return _PART.prepare(wait_s)


def prepare_for_start() -> AsciiTextFactory | None:
    """`prepare` as a session start calls it (from a thread): it waits at most
    `native.START_WAIT_S`, and the start goes on without it if it is not ready then (a
    compiler that hangs holds no start up)."""
    return _PART.prepare(native.START_WAIT_S)


def _library() -> contextlib.AbstractContextManager[str]:
    if os.environ.get(DISABLE_VARIABLE, "") == "0":
        raise native.Unusable(f"{DISABLE_VARIABLE}=0")
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        raise native.Unusable(
            f"written for CPython on Linux, not {sys.implementation.name} on {sys.platform}"
        )
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise native.Unusable(f"no Python.h in {include} (Python's development headers)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return native.cached_library("ascii-text", SOURCE, ["-O3", f"-I{include}"], suffix)
