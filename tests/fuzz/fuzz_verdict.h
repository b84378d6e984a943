/* fuzz_verdict: what a fuzz target decided about its last input ("accept", "reject", or a
 * target-specific word), so that tests/fuzz/replay.c can hold the hand-written seeds of a corpus to
 * the verdicts listed in that corpus's EXPECT file (one "FILE VERDICT" per line). libFuzzer itself
 * ignores it. */
#ifndef PD_FUZZ_VERDICT_H
#define PD_FUZZ_VERDICT_H

extern const char *fuzz_verdict;

#endif
