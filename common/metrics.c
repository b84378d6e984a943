typedef int metrics__unused_t;
