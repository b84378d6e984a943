/* The verdict of the last input (see fuzz_verdict.h). */
#include "fuzz_verdict.h"

const char *fuzz_verdict;
