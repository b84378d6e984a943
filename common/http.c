/* placeholder */ typedef int http__unused_t;
