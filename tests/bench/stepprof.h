/* stepprof: where a GPU step's time goes, kernel by kernel, from CUPTI's activity records (the
 * kernels' real start and end on the device, inside CUDA graphs and with programmatic dependent
 * launch overlap kept; no replay, no serialization as under ncu). For gpu_bench's `stepprof`.
 *
 * libcupti is loaded at run time (dlopen: the CUDA toolkit's lib, lib64 or extras/CUPTI/lib64,
 * or LD_LIBRARY_PATH), so nothing links against it and machines without it still build and run
 * everything else. One window at a time, from one thread:
 *
 *     if (stepprof_begin() == 0) {
 *         for (i = 0; i < n; i++) { stepprof_mark(); run_one_step(); }   // steps end in a sync
 *         stepprof_mark();
 *         stepprof_end("INT4 batch 1", 0.92);   // prints the table; floor in ms or 0
 *     }
 *
 * A step is the device work that starts between two marks. The table per window: launches, us
 * per step and share per kernel (template integer arguments kept: moe__gmm3<2,1>), and per step
 * the wall time (first start to last end), the busy time (union of the kernels' intervals), the
 * idle time inside the step, and the overlap (kernels running at once: PDL, side streams). */
#ifndef PD_TESTS_STEPPROF_H
#define PD_TESTS_STEPPROF_H

/* Loads CUPTI and starts recording kernel, memcpy and memset activity. 0, or -1 after printing
 * why to stderr (no libcupti, a CUPTI error, a window already open). */
int stepprof_begin(void);

/* A step boundary: the device work started after this call and before the next mark belongs to
 * the next step. Call it when the stream is idle (after the previous step's synchronization). */
void stepprof_mark(void);

/* Stops recording, prints the window's table (markdown, to stdout) under title, and forgets the
 * records. floor_ms > 0 adds the floor's share of the measured wall time. */
void stepprof_end(const char *title, double floor_ms);

#endif
