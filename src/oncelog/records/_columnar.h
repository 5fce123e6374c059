/* What the two files of records/_columnar (the column codec: _columnar.c encodes and
 * partitions, _columnar_decode.c decodes) share: Kafka's zig-zag varints (_varint.h, with
 * _recordwalk.c), and the decode functions the module table of _columnar.c names. */
#ifndef ONCELOG_COLUMNAR_H
#define ONCELOG_COLUMNAR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_varint.h"

PyObject *columnar_decode(PyObject *self, PyObject *args);
PyObject *columnar_binary_list(PyObject *self, PyObject *args);

#endif
