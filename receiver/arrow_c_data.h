/* A record batch of flat columns handed over through the Arrow C data interface
 * (https://arrow.apache.org/docs/format/CDataInterface.html), as a struct array and its schema, each in a
 * PyCapsule named as the Arrow PyCapsule interface says. pyarrow and polars take it without a copy.
 *
 * The batch owns the memory its columns point into (`batch_own`): releasing the struct array frees it all.
 * The structures below are the interface's ABI, as its specification gives them.
 */
#ifndef SLOSCOPE_ARROW_C_DATA_H
#define SLOSCOPE_ARROW_C_DATA_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARROW_FLAG_NULLABLE 2

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define BATCH_MAX_COLUMNS 32
#define BATCH_MAX_BUFFERS 4  /* a view column: validity, views, one data buffer, the data buffer's size */
#define BATCH_MAX_OWNED (4 * BATCH_MAX_COLUMNS)

typedef struct {
    int n_columns, n_owned;
    int64_t rows;
    const char *formats[BATCH_MAX_COLUMNS], *names[BATCH_MAX_COLUMNS];
    struct ArrowArray columns[BATCH_MAX_COLUMNS];
    struct ArrowArray *column_list[BATCH_MAX_COLUMNS];
    const void *buffers[BATCH_MAX_COLUMNS][BATCH_MAX_BUFFERS];
    int64_t data_sizes[BATCH_MAX_COLUMNS];  /* a view column's variadic buffer size */
    void *owned[BATCH_MAX_OWNED];
    const void *no_buffers[1];
} Batch;

/* Where a buffer of length 0 points: importers may read its address, never its bytes. */
static const uint64_t batch_empty[8];

static const void *batch_buffer(const void *data)
{
    return data ? data : (const void *)batch_empty;
}

/* Memory the batch frees when it is released; 0, or -1 (and data freed) when the batch can own no more. */
static int batch_own(Batch *b, void *data)
{
    if (b->n_owned == BATCH_MAX_OWNED) {
        free(data);
        return -1;
    }
    b->owned[b->n_owned++] = data;
    return 0;
}

/* LSB-first bits of one byte per row (0 or 1); NULL when out of memory. *zeros: how many rows were 0. */
static uint8_t *batch_bits(const uint8_t *bytes, int64_t rows, int64_t *zeros)
{
    uint8_t *bits = calloc((size_t)(rows + 7) / 8 + 1, 1);
    int64_t ones = 0;
    if (!bits)
        return NULL;
    for (int64_t k = 0; k < rows; k++) {
        bits[k >> 3] |= (uint8_t)((bytes[k] & 1) << (k & 7));
        ones += bytes[k] & 1;
    }
    *zeros = rows - ones;
    return bits;
}

static struct ArrowArray *batch_column(Batch *b, const char *format, const char *name, int64_t null_count,
                                       int n_buffers)
{
    int k = b->n_columns++;
    struct ArrowArray *c = &b->columns[k];
    b->formats[k] = format;
    b->names[k] = name;
    memset(c, 0, sizeof *c);
    c->length = b->rows;
    c->null_count = null_count;
    c->n_buffers = n_buffers;
    c->buffers = b->buffers[k];
    b->column_list[k] = c;
    return c;
}

/* A fixed-width column; validity: one byte per row, or NULL where every row is valid. */
static int batch_fixed(Batch *b, const char *format, const char *name, const void *values, const uint8_t *validity)
{
    int64_t nulls = 0;
    const void *bits = NULL;
    if (validity) {
        uint8_t *packed = batch_bits(validity, b->rows, &nulls);
        if (!packed || batch_own(b, packed))
            return -1;
        bits = nulls ? packed : NULL;
    }
    struct ArrowArray *c = batch_column(b, format, name, nulls, 2);
    c->buffers[0] = bits;
    c->buffers[1] = batch_buffer(values);
    return 0;
}

/* A boolean column from one byte per row. */
static int batch_booleans(Batch *b, const char *name, const uint8_t *values)
{
    int64_t zeros;
    uint8_t *packed = batch_bits(values, b->rows, &zeros);
    if (!packed || batch_own(b, packed))
        return -1;
    struct ArrowArray *c = batch_column(b, "b", name, 0, 2);
    c->buffers[0] = NULL;
    c->buffers[1] = packed;
    return 0;
}

/* A UTF-8 view column: 16-byte views, the one buffer their long strings lie in; validity: one byte per row, or
 * NULL where every row is valid. */
static int batch_views(Batch *b, const char *name, const void *views, const void *data, int64_t data_size,
                       const uint8_t *validity)
{
    int64_t nulls = 0;
    uint8_t *packed = NULL;
    if (validity && (!(packed = batch_bits(validity, b->rows, &nulls)) || batch_own(b, packed)))
        return -1;
    int k = b->n_columns;
    struct ArrowArray *c = batch_column(b, "vu", name, nulls, 4);
    b->data_sizes[k] = data_size;
    c->buffers[0] = nulls ? packed : NULL;
    c->buffers[1] = batch_buffer(views);
    c->buffers[2] = batch_buffer(data);
    c->buffers[3] = &b->data_sizes[k];
    return 0;
}

static void batch_release_column(struct ArrowArray *c)
{
    c->release = NULL;  /* its memory is the batch's */
}

static void batch_release(struct ArrowArray *array)
{
    Batch *b = array->private_data;
    for (int k = 0; k < b->n_owned; k++)
        free(b->owned[k]);
    free(b);
    array->release = NULL;
}

typedef struct {
    struct ArrowSchema fields[BATCH_MAX_COLUMNS];
    struct ArrowSchema *field_list[BATCH_MAX_COLUMNS];
} SchemaFields;

static void batch_release_field(struct ArrowSchema *s)
{
    s->release = NULL;
}

static void batch_release_schema(struct ArrowSchema *s)
{
    free(s->private_data);
    s->release = NULL;
}

static void batch_schema_capsule_free(PyObject *capsule)
{
    struct ArrowSchema *s = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (s && s->release)
        s->release(s);
    free(s);
}

static void batch_array_capsule_free(PyObject *capsule)
{
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a && a->release)
        a->release(a);
    free(a);
}

static int batch_schema(const Batch *b, struct ArrowSchema *s)
{
    SchemaFields *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    for (int k = 0; k < b->n_columns; k++) {
        f->fields[k] = (struct ArrowSchema){b->formats[k], b->names[k], NULL, ARROW_FLAG_NULLABLE, 0, NULL, NULL,
                                            batch_release_field, NULL};
        f->field_list[k] = &f->fields[k];
    }
    *s = (struct ArrowSchema){"+s", "", NULL, 0, b->n_columns, f->field_list, NULL, batch_release_schema, f};
    return 0;
}

/* (schema capsule, array capsule) of the batch, which they then own; NULL with an exception set on failure,
 * the batch freed. */
static PyObject *batch_capsules(Batch *b)
{
    struct ArrowSchema *schema = malloc(sizeof *schema);
    struct ArrowArray *array = malloc(sizeof *array);
    if (!schema || !array || batch_schema(b, schema)) {
        free(schema);
        free(array);
        struct ArrowArray unowned = {.private_data = b};
        batch_release(&unowned);
        return PyErr_NoMemory();
    }
    for (int k = 0; k < b->n_columns; k++)
        b->columns[k].release = batch_release_column;
    *array = (struct ArrowArray){b->rows, 0, 0, 1, b->n_columns, b->no_buffers, b->column_list, NULL,
                                 batch_release, b};
    PyObject *schema_capsule = PyCapsule_New(schema, "arrow_schema", batch_schema_capsule_free);
    if (!schema_capsule) {
        schema->release(schema);
        free(schema);
        batch_release(array);
        free(array);
        return NULL;
    }
    PyObject *array_capsule = PyCapsule_New(array, "arrow_array", batch_array_capsule_free);
    if (!array_capsule) {
        Py_DECREF(schema_capsule);
        batch_release(array);
        free(array);
        return NULL;
    }
    return Py_BuildValue("(NN)", schema_capsule, array_capsule);
}

#endif
