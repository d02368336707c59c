/* Hand-written JSON Schema corpus for tests/cpu/test_grammar.c: each schema with documents valid
 * under it (compact, properties in declared order: the forms the grammar produces) and documents
 * that are not. Validity is by the JSON Schema specification, written by hand. */
#ifndef GRAMMAR_CORPUS_H
#define GRAMMAR_CORPUS_H

typedef struct gcase {
    const char *schema;
    const char *valid[8];
    const char *invalid[10];
    const char *policy[6]; /* valid by the specification, refused by policy (whitespace, forms) */
} gcase;

static const gcase g_corpus[] = {
    {"{\"type\":\"null\"}", {"null"}, {"nul", "nulll", "0", "\"null\"", ""}, {" null", "null "}},
    {"{\"type\":\"boolean\"}", {"true", "false"}, {"tru", "True", "1", "null", "truee"}, {NULL}},
    {"{\"type\":\"integer\"}",
     {"0", "-0", "7", "-12", "1234567890123"},
     {"01", "1.5", "-", "+1", "--1", "a"},
     {"1e3", "1.0", "1 ", "12345678901234567"}},
    {"{\"type\":\"number\"}",
     {"0", "-1.5", "3.25e10", "1E-7", "2e+3", "0.0"},
     {"1.", ".5", "1e", "1e+", "00", "-a", "1.5.2", "0x10"},
     {"1e300", "0.12345678901234567", "1e-100"}},
    {"{\"type\":\"string\"}",
     {"\"\"", "\"abc\"", "\"a\\\"b\"", "\"\\u00e9\\n\"", "\"h\xc3\xa9llo \xe2\x82\xac\"",
      "\"\xf0\x9f\x98\x80\"", "\"\\\\/\""},
     {"\"abc", "abc", "\"a\"b\"", "\"\\x\"", "\"\x01\"", "\"\xc3\"", "\"\xed\xa0\x80\"",
      "\"\xc0\xaf\""},
     {NULL}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}",
     {"\"ab\"", "\"abcd\"", "\"\xc3\xa9\xc3\xa9\"", "\"\\n\\t\\\"\""},
     {"\"a\"", "\"\"", "\"abcde\"", "\"\xc3\xa9\""},
     {NULL}},
    {"{\"type\":\"string\",\"minLength\":3}",
     {"\"abc\"", "\"abcdefgh\""},
     {"\"ab\"", "\"\""},
     {NULL}},
    {"{\"type\":\"string\",\"maxLength\":0}", {"\"\""}, {"\"a\""}, {NULL}},
    {"{\"enum\":[\"red\",\"green\",1,null,[1,2],{\"a\":true}]}",
     {"\"red\"", "\"green\"", "1", "null", "[1,2]", "{\"a\":true}"},
     {"\"blue\"", "\"re\"", "2", "[1]", "{\"a\":false}", "true"},
     {NULL}},
    {"{\"const\":\"fixed\"}", {"\"fixed\""}, {"\"fixe\"", "\"fixedd\"", "null"}, {NULL}},
    {"{\"const\":{\"k\":[1,\"x\"]}}", {"{\"k\":[1,\"x\"]}"}, {"{\"k\":[1]}", "{}"}, {NULL}},
    {"{\"type\":[\"string\",\"null\"]}", {"\"x\"", "null"}, {"1", "true", "{}"}, {NULL}},
    {"{\"type\":[\"integer\",\"boolean\"]}", {"5", "true"}, {"1.5", "\"5\"", "null"}, {NULL}},
    {"{\"type\":\"integer\",\"nullable\":true}", {"3", "null"}, {"\"3\"", "false"}, {NULL}},
    {"{\"type\":\"object\"}",
     {"{}", "{\"a\":1}", "{\"a\":{\"b\":[1,null,\"c\"]},\"d\":false}"},
     {"[]", "{", "{\"a\"}", "{\"a\":}", "{a:1}", "{\"a\":1,}", "{,}", "null"},
     {NULL}},
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
     {"{\"name\":\"Al\",\"age\":3}"},
     {"{\"name\":\"Al\"}", "{\"age\":3}", "{}", "{\"name\":3,\"age\":3}",
      "{\"name\":\"Al\",\"age\":3,\"x\":1}", "{\"name\":\"Al\",\"age\":\"3\"}"},
     {"{\"age\":3,\"name\":\"Al\"}", "{ \"name\":\"Al\",\"age\":3}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
     "\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}",
     {"{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"b\":\"x\",\"c\":true}",
      "{\"a\":1,\"b\":\"x\",\"c\":false}"},
     {"{}", "{\"a\":1}", "{\"a\":1,\"c\":true}", "{\"b\":1}", "{\"b\":\"x\",}"},
     {NULL}},
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":"
     "\"number\"}}}",
     {"{}", "{\"x\":1}", "{\"y\":2}", "{\"x\":1,\"y\":2.5}"},
     {"{\"x\":\"1\"}", "{,\"y\":2}", "{\"x\":1,}", "{\"x\":1\"y\":2}"},
     {NULL}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{}", "{\"a\":1}", "{\"a\":1,\"b\":-2}"},
     {"{\"a\":\"x\"}", "{\"a\":1,\"b\":null}"},
     {NULL}},
    {"{\"type\":\"object\",\"additionalProperties\":false}", {"{}"}, {"{\"a\":1}"}, {NULL}},
    {"{\"type\":\"object\",\"required\":[\"id\"]}",
     {"{\"id\":5}", "{\"id\":{\"q\":[]}}"},
     {"{}", "{\"other\":1}"},
     {NULL}},
    {"{\"type\":\"array\"}",
     {"[]", "[1]", "[1,\"a\",null,[],{}]"},
     {"[", "[1,]", "[,1]", "{}"},
     {NULL}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
     {"[]", "[1]", "[1,2,3]"},
     {"[1.5]", "[\"a\"]", "[1,null]"},
     {NULL}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":2,\"maxItems\":3}",
     {"[\"a\",\"b\"]", "[\"a\",\"b\",\"c\"]"},
     {"[]", "[\"a\"]", "[\"a\",\"b\",\"c\",\"d\"]", "[\"a\",1]"},
     {NULL}},
    {"{\"type\":\"array\",\"minItems\":1}", {"[0]", "[0,{}]"}, {"[]"}, {NULL}},
    {"{\"type\":\"array\",\"maxItems\":0}", {"[]"}, {"[1]"}, {NULL}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
     "\"items\":false}",
     {"[]", "[\"a\"]", "[\"a\",1]"},
     {"[1]", "[\"a\",\"b\"]", "[\"a\",1,2]"},
     {NULL}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"boolean\"},"
     "\"minItems\":1}",
     {"[1]", "[1,true]", "[1,false,true]"},
     {"[]", "[2]", "[1,1]", "[true]"},
     {NULL}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}",
     {"1", "\"a\"", "\"\""},
     {"\"ab\"", "null", "1.5"},
     {NULL}},
    {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}",
     {"true", "null"},
     {"0", "\"\""},
     {NULL}},
    {"{\"allOf\":[{\"type\":\"string\",\"maxLength\":2}]}", {"\"ab\""}, {"\"abc\"", "1"}, {NULL}},
    {"{\"$defs\":{\"pos\":{\"type\":\"integer\"}},\"type\":\"object\",\"properties\":{\"p\":{"
     "\"$ref\":\"#/$defs/pos\"}},\"required\":[\"p\"]}",
     {"{\"p\":3}"},
     {"{\"p\":\"3\"}", "{}"},
     {NULL}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1}", "{\"v\":1,\"kids\":[]}",
      "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}"},
     {"{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"kids\":[{\"v\":\"x\"}]}"},
     {NULL}},
    {"{\"type\":[\"object\",\"null\"],\"properties\":{\"next\":{\"$ref\":\"#\"}},"
     "\"additionalProperties\":false}",
     {"null", "{}", "{\"next\":null}", "{\"next\":{\"next\":{}}}"},
     {"{\"next\":1}", "{\"x\":null}"},
     {NULL}},
    {"{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":"
     "\"#/definitions/s\"}}",
     {"[\"a\",\"b\"]"},
     {"[1]"},
     {NULL}},
    {"{\"title\":\"t\",\"description\":\"d\",\"$schema\":\"https://json-schema.org/draft/2020-12/"
     "schema\",\"type\":\"boolean\",\"default\":true}",
     {"true"},
     {"null"},
     {NULL}},
    {"true", {"1", "\"x\"", "{\"a\":[true,null]}", "[]"}, {"", "{", "tru"}, {NULL}},
    {"{}", {"null", "-2.5e3", "[[[]]]"}, {"[", "nul"}, {NULL}},
    {"{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"a\",\"b\"]},\"n\":{\"type\":["
     "\"integer\",\"null\"]}},\"required\":[\"k\",\"n\"],\"additionalProperties\":false}",
     {"{\"k\":\"a\",\"n\":null}", "{\"k\":\"b\",\"n\":4}"},
     {"{\"k\":\"c\",\"n\":null}", "{\"k\":\"a\"}"},
     {NULL}},
    {"{\"properties\":{\"q\":{\"type\":\"string\"}},\"required\":[\"q\"]}",
     {"{\"q\":\"\"}"},
     {"{}", "{\"q\":1}"},
     {NULL}},
    {"{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}",
     {"{}", "{\"b\":null}"},
     {"{\"a\":1}", "{\"a\":null}"},
     {NULL}},
};

/* Keywords refused by the compiler, with the name its message must contain. */
typedef struct gunsup {
    const char *schema, *keyword;
} gunsup;

static const gunsup g_unsupported[] = {
    {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", "pattern"},
    {"{\"type\":\"string\",\"format\":\"date\"}", "format"},
    {"{\"type\":\"integer\",\"minimum\":0}", "minimum"},
    {"{\"type\":\"number\",\"maximum\":5}", "maximum"},
    {"{\"type\":\"number\",\"exclusiveMinimum\":0}", "exclusiveMinimum"},
    {"{\"type\":\"integer\",\"multipleOf\":3}", "multipleOf"},
    {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", "patternProperties"},
    {"{\"type\":\"object\",\"minProperties\":1}", "minProperties"},
    {"{\"type\":\"object\",\"propertyNames\":{\"maxLength\":3}}", "propertyNames"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
    {"{\"type\":\"array\",\"contains\":{\"type\":\"integer\"}}", "contains"},
    {"{\"not\":{\"type\":\"null\"}}", "not"},
    {"{\"if\":{\"type\":\"null\"},\"then\":{}}", "if"},
    {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "allOf"},
    {"{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}", "dependentRequired"},
    {"{\"$ref\":\"#/$defs/missing\"}", "$ref"},
    {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
    {"{\"type\":\"string\",\"maxLength\":100000}", "maxLength"},
    {"{\"anyOf\":[{\"type\":\"string\"}],\"maxLength\":2}", "anyOf"},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"email\"}}}",
     "format"},
    {"false", "false"},
};

#endif
