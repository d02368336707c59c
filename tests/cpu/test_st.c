/* safetensors header parsing: a valid image parses to the right views, and every malformed one
 * gives a non-zero status with a message naming the file, the tensor and the field. */
#include <stdint.h>
#include <unistd.h>
#include "tulip.h"
#include "t_check.h"
#include "common/util.h"
#include "model/st.h"

/* Builds [8-byte length][json][data] in buf; returns its size. */
static size_t image(uint8_t *buf, size_t cap, const char *json, const void *data, size_t dlen) {
    size_t n = strlen(json);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    TL_ASSERT(8 + n + dlen <= cap);
    memcpy(buf + 8, json, n);
    if (dlen) memcpy(buf + 8 + n, data, dlen);
    return 8 + n + dlen;
}

static uint8_t g_buf[1 << 16];
static uint8_t g_data[256];

/* Parses json + 64 data bytes at an 8-aligned data start; expects failure containing s1 and s2. */
static void bad(const char *json, const char *s1, const char *s2) {
    char hdr[2048];
    /* pad the header with spaces so the data section starts 8-aligned */
    size_t n = strlen(json);
    snprintf(hdr, sizeof hdr, "%s%.*s", json, (int)((8 - n % 8) % 8), "       ");
    size_t sz = image(g_buf, sizeof g_buf, hdr, g_data, 64);
    tl_st_file f;
    char err[512] = "";
    int st = tl_st_parse(&f, g_buf, sz, "x.safetensors", err, sizeof err);
    CHECK(st < 0);
    CHECK(strstr(err, "x.safetensors") != NULL);
    if (s1 && !strstr(err, s1)) fprintf(stderr, "message lacks '%s': %s\n", s1, err);
    if (s2 && !strstr(err, s2)) fprintf(stderr, "message lacks '%s': %s\n", s2, err);
    CHECK(!s1 || strstr(err, s1));
    CHECK(!s2 || strstr(err, s2));
    if (!st) tl_st_close(&f);
}

static void test_valid(void) {
    for (int i = 0; i < 256; i++) g_data[i] = (uint8_t)i;
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[32,32]},"
                       "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]}}";
    char hdr[1024];
    size_t n = strlen(json);
    snprintf(hdr, sizeof hdr, "%s%.*s", json, (int)((8 - n % 8) % 8), "       ");
    size_t sz = image(g_buf, sizeof g_buf, hdr, g_data, 40);
    tl_st_file f;
    char err[256] = "";
    int st = tl_st_parse(&f, g_buf, sz, "ok.safetensors", err, sizeof err);
    CHECK_EQ_INT(st, 0);
    if (st) {
        fprintf(stderr, "%s\n", err);
        return;
    }
    CHECK_EQ_INT(f.n_tensors, 4);
    const uint8_t *data0 = g_buf + 8 + strlen(hdr);
    for (int i = 0; i < f.n_tensors; i++) {
        const tl_tensor *t = &f.tensors[i];
        if (!strcmp(t->name, "a")) {
            CHECK_EQ_INT(t->dtype, TL_DT_F32);
            CHECK_EQ_INT(t->ndim, 2);
            CHECK_EQ_INT(t->shape[1], 3);
            CHECK_EQ_INT(t->nbytes, 24);
            CHECK(t->data == data0);
        } else if (!strcmp(t->name, "b")) {
            CHECK_EQ_INT(t->dtype, TL_DT_BF16);
            CHECK(t->data == data0 + 24);
            CHECK_EQ_INT(((const uint8_t *)t->data)[0], 24);
        } else if (!strcmp(t->name, "e")) {
            CHECK_EQ_INT(t->nbytes, 0);
        } else {
            CHECK_STR(t->name, "s");
            CHECK_EQ_INT(t->ndim, 0);
            CHECK_EQ_INT(t->nbytes, 8);
        }
    }
    tl_st_close(&f);
}

static void test_short_and_length(void) {
    tl_st_file f;
    char err[256] = "";
    uint8_t b[16] = {0};
    CHECK(tl_st_parse(&f, b, 5, "x.safetensors", err, sizeof err) < 0);
    CHECK(strstr(err, "too short") != NULL);
    /* header length past the end of the file */
    b[0] = 100;
    CHECK(tl_st_parse(&f, b, 16, "x.safetensors", err, sizeof err) < 0);
    CHECK(strstr(err, "header length 100") && strstr(err, "past the end"));
    /* huge length (2^63) */
    memset(b, 0, 8);
    b[7] = 0x80;
    CHECK(tl_st_parse(&f, b, 16, "x.safetensors", err, sizeof err) < 0);
    CHECK(strstr(err, "past the end") != NULL);
}

static void test_bad_json(void) {
    bad("{\"a\":{\"dtype\":\"F32\",", "bad JSON", NULL);
    bad("[1,2,3]", "not a JSON object", NULL);
    bad("{\"a\":5}", "tensor 'a'", "expected an object");
    bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        "duplicate", NULL);
}

static void test_bad_dtype(void) {
    bad("{\"w\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}", "tensor 'w'",
        "dtype \"F4\"");
    bad("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", "tensor 'w'", "dtype");
    bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "tensor 'w'", "dtype");
}

static void test_bad_shape(void) {
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", "tensor 'w'",
        "shape[0]");
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,8]}}", "tensor 'w'",
        "shape[1]");
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", "tensor 'w'",
        "shape");
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}",
        "tensor 'w'", "overflows");
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
        "tensor 'w'", "at most 8");
    /* shape x dtype size != end - begin */
    bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", "tensor 'w'",
        "needs 12");
}

static void test_bad_offsets(void) {
    bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,4]}}", "tensor 'w'",
        "data_offsets");
    bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", "tensor 'w'",
        "data_offsets");
    bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", "tensor 'w'",
        "data_offsets");
    bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[60,68]}}", "tensor 'w'",
        "past the data section");
    bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,0]}}",
        "bad JSON", "too big"); /* jansson refuses integers beyond int64 */
    /* overlapping */
    bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
        "overlap", "'a'");
}

/* A header that is not padded to 8 bytes (as mlx writes them) leaves the data misaligned: the
 * parser must hand out aligned views with the right bytes. */
static void test_misaligned_data(void) {
    const char *json = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                       "\"w\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
    uint8_t data[16];
    for (int i = 0; i < 16; i++) data[i] = (uint8_t)(i * 7 + 1);
    char hdr[256];
    for (int pad = 0; pad < 4; pad++) { /* data section at every offset mod 4 */
        snprintf(hdr, sizeof hdr, "%s%.*s", json, pad, "   ");
        size_t sz = image(g_buf, sizeof g_buf, hdr, data, 16);
        tl_st_file f;
        char err[256] = "";
        CHECK_EQ_INT(tl_st_parse(&f, g_buf, sz, "m.safetensors", err, sizeof err), 0);
        for (int i = 0; i < f.n_tensors; i++) {
            const tl_tensor *t = &f.tensors[i];
            CHECK((uintptr_t)t->data % tl_dtype_size(t->dtype) == 0);
            size_t off = strcmp(t->name, "b") ? 8 : 0;
            CHECK(memcmp(t->data, data + off, t->nbytes) == 0);
        }
        CHECK((f.own != NULL) == ((8 + strlen(hdr)) % 4 != 0));
        tl_st_close(&f);
    }
}

/* A tensor at an odd offset inside the data section (packed back to back after an odd-sized
 * one) is misaligned whatever the header length: it too gets an aligned copy. */
static void test_misaligned_offset(void) {
    const char *json = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                       "\"w\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[6,14]}}";
    uint8_t data[14];
    for (int i = 0; i < 14; i++) data[i] = (uint8_t)(i * 13 + 5);
    char hdr[256];
    size_t n = strlen(json);
    snprintf(hdr, sizeof hdr, "%s%.*s", json, (int)((8 - n % 8) % 8), "       ");
    size_t sz = image(g_buf, sizeof g_buf, hdr, data, 14);
    tl_st_file f;
    char err[256] = "";
    CHECK_EQ_INT(tl_st_parse(&f, g_buf, sz, "m.safetensors", err, sizeof err), 0);
    CHECK(f.own != NULL);
    for (int i = 0; i < f.n_tensors; i++) {
        const tl_tensor *t = &f.tensors[i];
        CHECK((uintptr_t)t->data % 4 == 0);
        CHECK(memcmp(t->data, data + (strcmp(t->name, "b") ? 6 : 0), t->nbytes) == 0);
    }
    tl_st_close(&f);
}

static void test_files(void) {
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "/tmp/tulip-test-st-%d.safetensors", (int)getpid());
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {tl_f32_to_bf16(0.5f), tl_f32_to_bf16(-2.0f), tl_f32_to_bf16(3.0f)};
    tl_st_entry e[2] = {
        {.name = "a", .dtype = TL_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = TL_DT_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    CHECK_EQ_INT(tl_st_write(path, e, 2, err, sizeof err), 0);
    tl_st_file f;
    CHECK_EQ_INT(tl_st_open(&f, path, err, sizeof err), 0);
    CHECK_EQ_INT(f.n_tensors, 2);
    for (int i = 0; i < f.n_tensors; i++) {
        const tl_tensor *t = &f.tensors[i];
        if (!strcmp(t->name, "a"))
            CHECK(tl_load_elem(t->data, t->dtype, 5) == 6.0f);
        else
            CHECK(tl_load_elem(t->data, t->dtype, 1) == -2.0f);
    }
    size_t full = f.map_size;
    tl_st_close(&f);
    /* truncated by 2 bytes: the last tensor's end is past the data section */
    CHECK_EQ_INT(truncate(path, (off_t)full - 2), 0);
    CHECK(tl_st_open(&f, path, err, sizeof err) < 0);
    CHECK(strstr(err, path) && strstr(err, "tensor 'b'") && strstr(err, "past the data section"));
    /* truncated inside the header */
    CHECK_EQ_INT(truncate(path, 20), 0);
    CHECK(tl_st_open(&f, path, err, sizeof err) < 0);
    CHECK(strstr(err, "header length") && strstr(err, "past the end"));
    CHECK_EQ_INT(truncate(path, 3), 0);
    CHECK(tl_st_open(&f, path, err, sizeof err) < 0);
    CHECK(strstr(err, "too short") != NULL);
    unlink(path);
    CHECK(tl_st_open(&f, path, err, sizeof err) == TL_ERR_IO);
    CHECK(strstr(err, path) != NULL);
    /* writer refuses an order that would misalign a wider element */
    tl_st_entry e2[2] = {e[1], e[0]};
    CHECK(tl_st_write(path, e2, 2, err, sizeof err) < 0);
    CHECK(strstr(err, "misaligned") != NULL);
    unlink(path);
}

/* A file written by the Python safetensors library (the fixtures' reference data). */
static void test_python_written(void) {
    const char *p = "tests/data/tiny-a/ref.safetensors";
    if (access(p, R_OK)) {
        printf("# %s not present\n", p);
        return;
    }
    tl_st_file f;
    char err[512] = "";
    CHECK_EQ_INT(tl_st_open(&f, p, err, sizeof err), 0);
    int seen = 0;
    for (int i = 0; i < f.n_tensors; i++)
        if (!strcmp(f.tensors[i].name, "prompt_ids")) {
            seen = 1;
            CHECK_EQ_INT(f.tensors[i].dtype, TL_DT_I32);
            CHECK_EQ_INT(f.tensors[i].ndim, 1);
        }
    CHECK(seen);
    tl_st_close(&f);
}

int main(void) {
    T_RUN(test_valid);
    T_RUN(test_short_and_length);
    T_RUN(test_bad_json);
    T_RUN(test_bad_dtype);
    T_RUN(test_bad_shape);
    T_RUN(test_bad_offsets);
    T_RUN(test_misaligned_data);
    T_RUN(test_misaligned_offset);
    T_RUN(test_files);
    T_RUN(test_python_written);
    return t_summary();
}
